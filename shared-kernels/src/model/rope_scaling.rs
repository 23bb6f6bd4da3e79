//! RoPE's frequencies from a Hugging Face `config.json`: the `rope_type`s whose frequencies are
//! fixed by the config (default, linear, llama3, yarn), as transformers 5 computes them
//! (`modeling_rope_utils.py`), in f64. Types whose frequencies change with the length of the
//! batch being run (dynamic, longrope) are refused: a row's rotation would depend on its
//! neighbours, which is what lockstep exists to prevent.

use serde_json::{Map, Value};

/// How the inverse frequencies `theta^(-2i/d)` are rescaled.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    Default,
    /// Every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, the band between
    /// interpolated by wavelength.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_positions: f64 },
    /// YaRN: a ramp between interpolated and extrapolated frequencies over the dimensions, and
    /// cos/sin multiplied by `attention_factor`.
    Yarn { factor: f64, attention_factor: f64, beta_fast: f64, beta_slow: f64, original_max_positions: f64, truncate: bool },
}

/// The RoPE settings a model runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub scaling: RopeScaling,
}

/// A bad RoPE setting: the config key and what is wrong with it.
pub struct RopeKeyError {
    pub key: String,
    pub message: String,
}

fn bad(key: &str, message: String) -> RopeKeyError {
    RopeKeyError { key: key.to_string(), message }
}

/// `v` as a finite number above zero, or an error naming `key`.
fn positive(key: &str, v: &Value) -> Result<f64, RopeKeyError> {
    v.as_f64().filter(|f| f.is_finite() && *f > 0.0).ok_or_else(|| bad(key, format!("must be a positive number, got {v}")))
}

impl Rope {
    /// Reads transformers' two spellings: 4.x's `rope_scaling` (which wins, as transformers 5
    /// lets it) with a top-level `rope_theta`, and 5's `rope_parameters`.
    pub fn from_config(raw: &Value, max_position_embeddings: usize) -> Result<Self, RopeKeyError> {
        let (section, params) = match (raw.get("rope_scaling").filter(|v| !v.is_null()), raw.get("rope_parameters").filter(|v| !v.is_null())) {
            (Some(v), _) => ("rope_scaling", v),
            (None, Some(v)) => ("rope_parameters", v),
            (None, None) => ("rope_parameters", &Value::Null),
        };
        let empty = Map::new();
        let params = match params {
            Value::Object(m) => m,
            Value::Null => &empty,
            other => return Err(bad(section, format!("must be an object, got {other}"))),
        };
        let key = |k: &str| format!("{section}.{k}");
        // a number from the section, else the top level (transformers' precedence), else None
        let number = |k: &str, top: bool| -> Result<Option<f64>, RopeKeyError> {
            let (name, v) = match params.get(k).filter(|v| !v.is_null()) {
                Some(v) => (key(k), v),
                None => match raw.get(k).filter(|v| top && !v.is_null()) {
                    Some(v) => (k.to_string(), v),
                    None => return Ok(None),
                },
            };
            positive(&name, v).map(Some)
        };
        let required = |k: &str| number(k, false)?.ok_or_else(|| bad(&key(k), "missing".into()));
        let theta = number("rope_theta", true)?.unwrap_or(10_000.0);
        if let Some(f) = number("partial_rotary_factor", true)?.filter(|&f| f != 1.0) {
            return Err(bad("partial_rotary_factor", format!("{f}: rotating part of each head is not supported (only 1.0)")));
        }
        let kind = match params.get("rope_type").or_else(|| params.get("type")) {
            None | Some(Value::Null) => "default",
            Some(Value::String(s)) => s.as_str(),
            Some(other) => return Err(bad(&key("rope_type"), format!("must be a string, got {other}"))),
        };
        // transformers gives a top-level `original_max_position_embeddings` (Phi-3's) priority
        let original = || -> Result<f64, RopeKeyError> {
            let top = raw.get("original_max_position_embeddings").filter(|v| !v.is_null());
            match top {
                Some(v) => positive("original_max_position_embeddings", v),
                None => Ok(number("original_max_position_embeddings", false)?.unwrap_or(max_position_embeddings as f64)),
            }
        };
        let scaling = match kind {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear { factor: required("factor")? },
            "llama3" => {
                let (low, high) = (required("low_freq_factor")?, required("high_freq_factor")?);
                if high <= low {
                    return Err(bad(&key("high_freq_factor"), format!("{high} must be above low_freq_factor {low}")));
                }
                RopeScaling::Llama3 { factor: required("factor")?, low_freq_factor: low, high_freq_factor: high, original_max_positions: original()? }
            }
            "yarn" => {
                let original_max_positions = original()?;
                let factor = match number("factor", false)? {
                    Some(f) => f,
                    None => max_position_embeddings as f64 / original_max_positions,
                };
                let mscale = |scale: f64, m: f64| if scale <= 1.0 { 1.0 } else { 0.1 * m * scale.ln() + 1.0 };
                let attention_factor = match number("attention_factor", false)? {
                    Some(a) => a,
                    None => match (number("mscale", false)?, number("mscale_all_dim", false)?) {
                        (Some(m), Some(all)) => mscale(factor, m) / mscale(factor, all),
                        _ => mscale(factor, 1.0),
                    },
                };
                let truncate = match params.get("truncate") {
                    None | Some(Value::Null) => true,
                    Some(v) => v.as_bool().ok_or_else(|| bad(&key("truncate"), format!("must be true or false, got {v}")))?,
                };
                RopeScaling::Yarn {
                    factor,
                    attention_factor,
                    beta_fast: number("beta_fast", false)?.unwrap_or(32.0),
                    beta_slow: number("beta_slow", false)?.unwrap_or(1.0),
                    original_max_positions,
                    truncate,
                }
            }
            "dynamic" | "longrope" => {
                return Err(bad(&key("rope_type"), format!("`{kind}` RoPE changes its frequencies with the length of the batch being run, so a row's rotation would depend on its neighbours; lockstep supports the fixed types \"default\", \"linear\", \"llama3\" and \"yarn\"")))
            }
            other => return Err(bad(&key("rope_type"), format!("`{other}` RoPE is not supported; lockstep supports \"default\", \"linear\", \"llama3\" and \"yarn\""))),
        };
        Ok(Self { theta, scaling })
    }

    /// The `head_dim / 2` inverse frequencies, in f64.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f64> {
        let d = head_dim as f64;
        // the same f64 expression as plain RoPE's tables, so unscaled models keep their bits
        let base = crate::ops::rope::default_inv_freq(head_dim, self.theta);
        match self.scaling {
            RopeScaling::Default => base,
            RopeScaling::Linear { factor } => base.iter().map(|f| f / factor).collect(),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_positions } => {
                let (low_wavelen, high_wavelen) = (original_max_positions / low_freq_factor, original_max_positions / high_freq_factor);
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (original_max_positions / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn { factor, beta_fast, beta_slow, original_max_positions, truncate, .. } => {
                let correction = |rotations: f64| d * (original_max_positions / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * self.theta.ln());
                let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
                if truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
                if low == high {
                    high += 0.001;
                }
                base.iter()
                    .enumerate()
                    .map(|(i, &f)| {
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolated = 1.0 - ramp;
                        (f / factor) * (1.0 - extrapolated) + f * extrapolated
                    })
                    .collect()
            }
        }
    }

    /// The factor cos and sin are multiplied by (YaRN's attention factor; 1 otherwise).
    pub fn attention_factor(&self) -> f64 {
        match self.scaling {
            RopeScaling::Yarn { attention_factor, .. } => attention_factor,
            _ => 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(json: &str) -> Result<Rope, String> {
        Rope::from_config(&serde_json::from_str(json).unwrap(), 131_072).map_err(|e| format!("{}: {}", e.key, e.message))
    }

    #[test]
    fn default_frequencies_are_the_plain_powers_of_theta() {
        let r = rope(r#"{"rope_theta": 500000.0}"#).unwrap();
        assert_eq!(r.scaling, RopeScaling::Default);
        let f = r.inv_freq(128);
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[1].to_bits(), 500000f64.powf(-2.0 / 128.0).to_bits());
    }

    /// Llama 3.1's table (factor 8, 1 / 4, 8192): the highest frequencies kept, the lowest
    /// divided by 8, the band between smoothed; values from transformers 5's formula by hand.
    #[test]
    fn llama3_keeps_high_divides_low_and_smooths_between() {
        let r = rope(r#"{"rope_theta": 500000.0, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}}"#).unwrap();
        let plain = Rope { theta: 500000.0, scaling: RopeScaling::Default }.inv_freq(128);
        let f = r.inv_freq(128);
        let wavelen = |x: f64| 2.0 * std::f64::consts::PI / x;
        let (mut kept, mut divided, mut smoothed) = (0, 0, 0);
        for (i, (&got, &p)) in f.iter().zip(&plain).enumerate() {
            if wavelen(p) < 2048.0 {
                assert_eq!(got, p, "{i}");
                kept += 1;
            } else if wavelen(p) > 8192.0 {
                assert_eq!(got, p / 8.0, "{i}");
                divided += 1;
            } else {
                assert!(got < p && got > p / 8.0, "{i}: {got} not between {p} / 8 and {p}");
                smoothed += 1;
            }
        }
        assert!(kept > 0 && divided > 0 && smoothed > 0, "{kept} {divided} {smoothed}");
    }

    #[test]
    fn yarn_ramps_from_extrapolated_to_interpolated_and_scales_cos_sin() {
        let r = rope(r#"{"rope_theta": 1000000.0, "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}"#).unwrap();
        assert!((r.attention_factor() - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-15);
        let plain = Rope { theta: 1e6, scaling: RopeScaling::Default }.inv_freq(128);
        let f = r.inv_freq(128);
        assert_eq!(f[0], plain[0], "the fastest rotation extrapolates");
        assert!((f[63] - plain[63] / 4.0).abs() <= 1e-18, "the slowest interpolates");
        assert!(f.windows(2).all(|w| w[1] < w[0]));
    }

    #[test]
    fn rope_parameters_of_transformers_5_and_linear_scaling() {
        let r = rope(r#"{"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}"#).unwrap();
        assert_eq!(r.inv_freq(4), vec![0.5, 0.01 / 2.0]);
        let r = rope(r#"{"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}"#).unwrap();
        assert_eq!((r.theta, r.scaling), (1e6, RopeScaling::Default));
    }

    #[test]
    fn batch_dependent_unknown_and_malformed_settings_name_their_key() {
        let e = rope(r#"{"rope_scaling": {"type": "dynamic", "factor": 2.0}}"#).unwrap_err();
        assert!(e.starts_with("rope_scaling.rope_type: `dynamic`") && e.contains("neighbours"), "{e}");
        let e = rope(r#"{"rope_parameters": {"rope_type": "longrope"}}"#).unwrap_err();
        assert!(e.contains("`longrope`") && e.contains("neighbours"), "{e}");
        let e = rope(r#"{"rope_scaling": {"rope_type": "mystery"}}"#).unwrap_err();
        assert!(e.contains("`mystery` RoPE is not supported"), "{e}");
        let e = rope(r#"{"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}}"#).unwrap_err();
        assert_eq!(e, "rope_scaling.high_freq_factor: missing");
        let e = rope(r#"{"rope_scaling": {"rope_type": "linear", "factor": -1}}"#).unwrap_err();
        assert!(e.starts_with("rope_scaling.factor: must be a positive number"), "{e}");
        let e = rope(r#"{"rope_theta": 10000.0, "partial_rotary_factor": 0.5}"#).unwrap_err();
        assert!(e.starts_with("partial_rotary_factor: 0.5"), "{e}");
        let e = rope(r#"{"rope_scaling": [1, 2]}"#).unwrap_err();
        assert!(e.starts_with("rope_scaling: must be an object"), "{e}");
    }
}
