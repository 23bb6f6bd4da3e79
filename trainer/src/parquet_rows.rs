//! A Parquet file's rows as JSON values (the `parquet` crate's record reader: nested lists and
//! structs become arrays and objects), so a dataset in verl's layout reads like a JSON-lines
//! one. Rows are numbered from 1, as lines are.

use parquet::file::reader::{FileReader, SerializedFileReader};
use std::path::Path;

/// Every row of `path`, or (row, message) for the first that cannot be read (0: the file).
pub fn rows(path: &Path) -> Result<Vec<(usize, serde_json::Value)>, (usize, String)> {
    let file = std::fs::File::open(path).map_err(|e| (0, e.to_string()))?;
    let reader = SerializedFileReader::new(file).map_err(|e| (0, format!("not a readable Parquet file: {e}")))?;
    let iter = reader.get_row_iter(None).map_err(|e| (0, format!("not a readable Parquet file: {e}")))?;
    let mut out = Vec::new();
    for (i, row) in iter.enumerate() {
        let row = row.map_err(|e| (i + 1, format!("row {} cannot be read: {e}", i + 1)))?;
        out.push((i + 1, row.to_json_value()));
    }
    Ok(out)
}
