//! A Parquet file's rows as JSON values (the `parquet` crate's record reader: nested lists and
//! structs become arrays and objects), so a dataset in verl's layout reads like a JSON-lines
//! one. Rows are numbered from 1, as lines are.
//!
//! The crate's own JSON mapping would hand a binary column without a string annotation (how
//! Spark and Hive write strings) over as base64, so a prompt "1+1=" became "MSsxPQ==", and turn
//! NaN and infinite floats into null. Here such binary is read as the UTF-8 text it holds, and
//! what cannot be read as text or a number (binary that is not UTF-8, a non-finite float) becomes
//! a marker object ([`unreadable`]) that names the problem if a task reads that column: other
//! columns (images, scores) may hold anything.

use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::{Field, Row};
use serde_json::Value;
use std::path::Path;

/// The key of the marker object that stands for a value JSON cannot carry.
const MARKER: &str = "$parquet value";

/// Every row of `path`, or (row, message) for the first that cannot be read (0: the file).
pub fn rows(path: &Path) -> Result<Vec<(usize, Value)>, (usize, String)> {
    let file = std::fs::File::open(path).map_err(|e| (0, e.to_string()))?;
    let reader = SerializedFileReader::new(file).map_err(|e| (0, format!("not a readable Parquet file: {e}")))?;
    let iter = reader.get_row_iter(None).map_err(|e| (0, format!("not a readable Parquet file: {e}")))?;
    let mut out = Vec::new();
    for (i, row) in iter.enumerate() {
        let row = row.map_err(|e| (i + 1, format!("row {} cannot be read: {e}", i + 1)))?;
        out.push((i + 1, object_of(&row)));
    }
    Ok(out)
}

/// What a marker object stands for ("binary that is not UTF-8 text", "NaN"), `None` for any
/// other value.
pub fn unreadable(v: &Value) -> Option<&str> {
    v.as_object().filter(|o| o.len() == 1).and_then(|o| o.get(MARKER)).and_then(Value::as_str)
}

fn marker(what: String) -> Value {
    Value::Object(serde_json::Map::from_iter([(MARKER.to_string(), Value::String(what))]))
}

fn object_of(row: &Row) -> Value {
    Value::Object(row.get_column_iter().map(|(name, field)| (name.clone(), json_of(field))).collect())
}

fn json_of(field: &Field) -> Value {
    let float = |x: f64| if x.is_finite() { field.to_json_value() } else { marker(format!("{x} (a Parquet float)")) };
    match field {
        Field::Bytes(b) => match std::str::from_utf8(b.data()) {
            Ok(text) => Value::String(text.to_owned()),
            Err(_) => marker("binary that is not UTF-8 text".into()),
        },
        Field::Float16(x) => float(f64::from(*x)),
        Field::Float(x) => float(f64::from(*x)),
        Field::Double(x) => float(*x),
        Field::Group(row) => object_of(row),
        Field::ListInternal(list) => Value::Array(list.elements().iter().map(json_of).collect()),
        Field::MapInternal(map) => Value::Object(
            map.entries()
                .iter()
                .map(|(k, v)| {
                    let key = json_of(k);
                    (key.as_str().map(str::to_owned).unwrap_or_else(|| key.to_string()), json_of(v))
                })
                .collect(),
        ),
        other => other.to_json_value(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::data_type::{ByteArray, ByteArrayType, DoubleType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use std::sync::Arc;

    /// Two rows of un-annotated binary text (Spark's strings), binary that is not text, and a
    /// double column holding 2.5 and NaN.
    fn write_fixture(path: &Path) {
        let schema = "message schema { REQUIRED BYTE_ARRAY prompt; REQUIRED BYTE_ARRAY image; REQUIRED DOUBLE score; }";
        let schema = Arc::new(parquet::schema::parser::parse_message_type(schema).unwrap());
        let mut writer = SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, Arc::new(WriterProperties::builder().build())).unwrap();
        let mut group = writer.next_row_group().unwrap();
        for column in 0..3 {
            let mut col = group.next_column().unwrap().unwrap();
            match column {
                0 => col.typed::<ByteArrayType>().write_batch(&[ByteArray::from("1+1="), ByteArray::from("2+2=")], None, None),
                1 => col.typed::<ByteArrayType>().write_batch(&[ByteArray::from(vec![0xffu8, 0xfe]), ByteArray::from(vec![0x89u8, b'P'])], None, None),
                _ => col.typed::<DoubleType>().write_batch(&[2.5, f64::NAN], None, None),
            }
            .unwrap();
            col.close().unwrap();
        }
        group.close().unwrap();
        writer.close().unwrap();
    }

    #[test]
    fn binary_text_reads_as_text_and_what_json_cannot_carry_is_named_not_base64_or_null() {
        let dir = shared_kernels::testing::Scratch::new("parquet-binary");
        let path = dir.join("spark.parquet");
        write_fixture(&path);
        let rows = rows(&path).unwrap();
        assert_eq!(rows.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![1, 2]);
        // the crate's own mapping gave "MSsxPQ==" (base64) and null here
        assert_eq!(rows[0].1["prompt"], Value::String("1+1=".into()));
        assert_eq!(rows[1].1["prompt"], Value::String("2+2=".into()));
        assert_eq!(unreadable(&rows[0].1["image"]), Some("binary that is not UTF-8 text"));
        assert_eq!(rows[0].1["score"], serde_json::json!(2.5));
        assert_eq!(unreadable(&rows[1].1["score"]), Some("NaN (a Parquet float)"));
        assert_eq!(unreadable(&rows[0].1["prompt"]), None);
        std::fs::remove_dir_all(&dir).ok();
    }
}
