//! lockstep patch (self-contained: shared-kernels' tests include this file by path).
//!
//! NVRTC's automatic precompiled header covers only the run of preprocessing directives a
//! source starts with. cubecl-cpp writes its typedefs before its `#include` block, so every
//! kernel parses its headers afresh: `cuda/barrier` and `cooperative_groups` take ~1 s a TMA
//! matmul kernel, most of that kernel's compile. [`includes_first`] moves the block to the
//! top; the rest of the text keeps its order, so the PTX differs only in line numbers.

/// `source` with its one block of consecutive `#include` lines moved to the top, or `None`
/// when that would not be a plain move: no block, more than one, or a preprocessing
/// directive before it (an include under an `#if` must stay where it is).
pub fn includes_first(source: &str) -> Option<String> {
    let lines: Vec<&str> = source.split_inclusive('\n').collect();
    let is_include = |line: &str| line.trim_start().starts_with("#include");
    let start = lines.iter().position(|l| is_include(l))?;
    if start == 0 || lines[..start].iter().any(|l| l.trim_start().starts_with('#')) {
        return None;
    }
    let end = start + lines[start..].iter().take_while(|l| is_include(l)).count();
    if lines[end..].iter().any(|l| is_include(l)) {
        return None;
    }
    let mut out = String::with_capacity(source.len() + 1);
    for line in &lines[start..end] {
        out.push_str(line);
        if !line.ends_with('\n') {
            out.push('\n');
        }
    }
    for line in lines[..start].iter().chain(&lines[end..]) {
        out.push_str(line);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::includes_first;

    #[test]
    fn the_include_block_moves_to_the_top_and_nothing_else_moves() {
        let source = "typedef unsigned int uint32_t;\nstruct A { int x; };\n#include <cuda/barrier>\n#include <cuda_bf16.h>\nextern \"C\" __global__ void k() {}\n";
        let moved = includes_first(source).expect("one block after plain code");
        assert_eq!(moved, "#include <cuda/barrier>\n#include <cuda_bf16.h>\ntypedef unsigned int uint32_t;\nstruct A { int x; };\nextern \"C\" __global__ void k() {}\n");
        let mut sorted_in: Vec<&str> = source.lines().collect();
        let mut sorted_out: Vec<&str> = moved.lines().collect();
        sorted_in.sort();
        sorted_out.sort();
        assert_eq!(sorted_in, sorted_out, "the same lines, only reordered");
    }

    #[test]
    fn a_source_it_cannot_move_plainly_is_left_alone() {
        // already first: nothing to gain
        assert_eq!(includes_first("#include <a.h>\nint x;\n"), None);
        // no includes
        assert_eq!(includes_first("int x;\n"), None);
        // a directive before the block: the include may depend on it
        assert_eq!(includes_first("#define N 4\nint x;\n#include <a.h>\n"), None);
        assert_eq!(includes_first("int x;\n#if 1\n#include <a.h>\n#endif\n"), None);
        // two blocks
        assert_eq!(includes_first("int x;\n#include <a.h>\nint y;\n#include <b.h>\n"), None);
    }

    #[test]
    fn a_last_line_without_newline_keeps_the_lines_apart() {
        assert_eq!(includes_first("int x;\n#include <a.h>").as_deref(), Some("#include <a.h>\nint x;\n"));
    }
}
