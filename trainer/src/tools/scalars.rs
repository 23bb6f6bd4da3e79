//! What `report` and `report_arms` share: a run's scalars and the plots' font.

use plotters::prelude::*;
use std::collections::BTreeMap;

/// tag -> (step, value), sorted by step.
pub type Scalars = BTreeMap<String, Vec<(i64, f32)>>;

/// Registers DejaVu Sans for the plots' labels; false where the font is missing (plots are
/// then drawn without text).
pub fn font() -> bool {
    for path in ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/TTF/DejaVuSans.ttf"] {
        if let Ok(bytes) = std::fs::read(path) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            return plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok();
        }
    }
    false
}

/// Draws a PNG beside `file` with `draw(temp path)` and renames it over `file`, so a failed or
/// killed report leaves the earlier plot whole (the backend picks the format by extension).
pub fn png_atomically(file: &std::path::Path, draw: impl FnOnce(&std::path::Path) -> Result<(), String>) -> Result<(), String> {
    let tmp = file.with_file_name(format!(".{}.{}.png", file.file_stem().and_then(|n| n.to_str()).unwrap_or("plot"), std::process::id()));
    if let Err(e) = draw(&tmp) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, file).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("{}: {e}", file.display())
    })
}
