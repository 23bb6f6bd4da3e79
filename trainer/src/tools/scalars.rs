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
