//! Where and as what a process joins its data-parallel group: torchrun's variables.

use std::time::Duration;

/// Where and as what this process joins its group (torchrun's variables).
#[derive(Clone, Debug, PartialEq)]
pub struct Rendezvous {
    pub rank: usize,
    pub world: usize,
    pub master: String,
    pub timeout: Duration,
}

impl Rendezvous {
    /// The group this process belongs to, from the environment: `None` when `RANK` is not set
    /// (one process, no group); an error naming the variable when one is missing or malformed.
    pub fn from_env(get: impl Fn(&str) -> Option<String>, timeout: Duration) -> Result<Option<Rendezvous>, String> {
        let Some(rank) = get("RANK") else { return Ok(None) };
        let number = |name: &str, text: &str| text.trim().parse::<usize>().map_err(|_| format!("{name}={text:?} is not a whole number"));
        let rank = number("RANK", &rank)?;
        let world = number("WORLD_SIZE", &get("WORLD_SIZE").ok_or("RANK is set but WORLD_SIZE is not")?)?;
        if world == 0 || rank >= world {
            return Err(format!("RANK={rank} must be below WORLD_SIZE={world}"));
        }
        let addr = get("MASTER_ADDR").ok_or("RANK is set but MASTER_ADDR is not")?;
        let port = get("MASTER_PORT").ok_or("RANK is set but MASTER_PORT is not")?;
        let port: u16 = port.trim().parse().map_err(|_| format!("MASTER_PORT={port:?} is not a port number"))?;
        Ok(Some(Rendezvous { rank, world, master: format!("{}:{port}", addr.trim()), timeout }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    #[test]
    fn torchruns_variables_make_a_rendezvous_and_bad_ones_name_the_variable() {
        let t = Duration::from_secs(9);
        assert_eq!(Rendezvous::from_env(env(&[]), t), Ok(None));
        let ok = [("RANK", "1"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "10.0.0.2"), ("MASTER_PORT", "29500")];
        assert_eq!(Rendezvous::from_env(env(&ok), t), Ok(Some(Rendezvous { rank: 1, world: 4, master: "10.0.0.2:29500".into(), timeout: t })));
        let cases: [(&[(&str, &str)], &str); 5] = [
            (&[("RANK", "1")], "WORLD_SIZE"),
            (&[("RANK", "x"), ("WORLD_SIZE", "2")], "RANK=\"x\""),
            (&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "a"), ("MASTER_PORT", "1")], "below WORLD_SIZE"),
            (&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "1")], "MASTER_ADDR"),
            (&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "a"), ("MASTER_PORT", "99999")], "MASTER_PORT"),
        ];
        for (vars, named) in cases {
            let e = Rendezvous::from_env(env(vars), t).unwrap_err();
            assert!(e.contains(named), "{vars:?}: {e}");
        }
    }
}
