//! `child::end_all`, lockstep's last word to the child programs it runs, in a test binary of its
//! own: it ends every registered program of the process, which would kill other tests' programs.

use std::time::{Duration, Instant};

fn alive(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks the process exists
    unsafe { libc::kill(pid, 0) == 0 }
}

#[test]
fn end_all_ends_a_running_programs_whole_group() {
    let dir = shared_kernels::testing::Scratch::new("child-end-all");
    let pidfile = dir.join("pids");
    let script = format!("sleep 600 & echo $! > {}; wait", pidfile.display());
    let runner = std::thread::spawn(move || trainer::child::run(&script, Vec::new(), Duration::from_secs(60)).map(|f| f.status));
    let read = || std::fs::read_to_string(&pidfile).unwrap_or_default().trim().parse::<i32>().ok();
    let until = Instant::now() + Duration::from_secs(10);
    while read().is_none() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let worker = read().expect("the program started its worker");
    trainer::child::end_all();
    let status = runner.join().unwrap().unwrap_or_else(|_| panic!("the program did not end"));
    assert!(!status.success());
    let until = Instant::now() + Duration::from_secs(5);
    while alive(worker) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!alive(worker), "the worker outlived end_all");
}
