//! `tokenizer.json` through the `tokenizers` crate (0.22: the 1.0 release candidates have no
//! `Tokenizer`), with errors that name the file.

use super::ModelError;
use std::path::Path;
use tokenizers::Tokenizer;

pub fn load_tokenizer(path: &Path) -> Result<Tokenizer, ModelError> {
    if !path.exists() {
        return Err(ModelError::Tokenizer { file: path.display().to_string(), message: "file not found".into() });
    }
    Tokenizer::from_file(path).map_err(|e| ModelError::Tokenizer { file: path.display().to_string(), message: e.to_string() })
}
