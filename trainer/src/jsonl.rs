//! Reading JSONL inputs (task datasets, prompt files): one JSON value per non-blank line, a
//! leading UTF-8 byte-order mark skipped, and every problem named by file and line, bad UTF-8
//! included (a whole-file read would only say the file is not UTF-8).

use std::path::Path;

/// The non-blank lines of `path` as (1-based line number, text); `Err((line, message))` for an
/// unreadable file (line 0) or a line that is not UTF-8.
pub fn lines(path: &Path) -> Result<Vec<(usize, String)>, (usize, String)> {
    let bytes = std::fs::read(path).map_err(|e| (0, format!("cannot read: {e}")))?;
    let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(&bytes);
    let mut out = Vec::new();
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let text = std::str::from_utf8(raw).map_err(|e| (i + 1, format!("not valid UTF-8 (byte {} of the line)", e.valid_up_to() + 1)))?;
        let text = text.strip_suffix('\r').unwrap_or(text);
        if !text.trim().is_empty() {
            out.push((i + 1, text.to_string()));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn lines_are_numbered_and_bad_utf8_names_its_line() {
        let dir = shared_kernels::testing::Scratch::new("jsonl");
        let f = dir.join("a.jsonl");
        std::fs::write(&f, b"\xef\xbb\xbf{\"a\": 1}\r\n\n{\"b\": 2}\n").unwrap();
        assert_eq!(super::lines(&f).unwrap(), vec![(1, "{\"a\": 1}".to_string()), (3, "{\"b\": 2}".to_string())]);
        std::fs::write(&f, b"{\"a\": 1}\n{\"b\": \"\xff\"}\n").unwrap();
        let (line, message) = super::lines(&f).unwrap_err();
        assert_eq!(line, 2);
        assert!(message.contains("UTF-8"), "{message}");
        assert_eq!(super::lines(&dir.join("missing.jsonl")).unwrap_err().0, 0);
    }
}
