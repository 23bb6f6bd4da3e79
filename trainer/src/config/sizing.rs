//! Memory sizes (and the recomputation switch that trades memory for a forward) a run can leave
//! to the device: `"auto"` (chosen before step 0 from the device's free memory by
//! `memory_plan::auto`) or a value the user set, which always wins.

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

/// A memory size or switch: `Auto` until the memory plan resolves it, or the value the config set.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum Sizing<T> {
    #[default]
    Auto,
    Set(T),
}

impl<T: Copy> Sizing<T> {
    /// The value the config set, `None` for `"auto"`.
    pub fn set(self) -> Option<T> {
        match self {
            Sizing::Auto => None,
            Sizing::Set(v) => Some(v),
        }
    }

    pub fn is_auto(self) -> bool {
        matches!(self, Sizing::Auto)
    }
}

impl Sizing<bool> {
    /// Set and on (`Auto` is off until the memory plan turns it on).
    pub fn on(self) -> bool {
        matches!(self, Sizing::Set(true))
    }
}

impl<T: Serialize> Serialize for Sizing<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Sizing::Auto => s.serialize_str("auto"),
            Sizing::Set(v) => v.serialize(s),
        }
    }
}

/// The types a [`Sizing`] holds: how each takes a TOML integer, float, boolean or text
/// (`--set key=16384` on a key whose default is the string "auto" arrives as text).
pub trait SizeValue: Sized {
    const WHAT: &'static str;
    fn from_i64(v: i64) -> Option<Self>;
    fn from_f64(v: f64) -> Option<Self>;
    fn from_bool(_: bool) -> Option<Self> {
        None
    }
}

impl SizeValue for usize {
    const WHAT: &'static str = "\"auto\" or a whole number >= 0";
    fn from_i64(v: i64) -> Option<Self> {
        usize::try_from(v).ok()
    }
    fn from_f64(_: f64) -> Option<Self> {
        None
    }
}

impl SizeValue for f64 {
    const WHAT: &'static str = "\"auto\" or a finite number >= 0";
    fn from_i64(v: i64) -> Option<Self> {
        (v >= 0).then_some(v as f64)
    }
    fn from_f64(v: f64) -> Option<Self> {
        (v.is_finite() && v >= 0.0).then_some(v)
    }
}

impl SizeValue for bool {
    const WHAT: &'static str = "\"auto\", true or false";
    fn from_i64(_: i64) -> Option<Self> {
        None
    }
    fn from_f64(_: f64) -> Option<Self> {
        None
    }
    fn from_bool(v: bool) -> Option<Self> {
        Some(v)
    }
}

impl<'de, T: SizeValue> Deserialize<'de> for Sizing<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<T>(std::marker::PhantomData<T>);
        impl<T> Clone for Visit<T> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<T> Copy for Visit<T> {}
        impl<T: SizeValue> de::Visitor<'_> for Visit<T> {
            type Value = Sizing<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(T::WHAT)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                T::from_i64(v).map(Sizing::Set).ok_or_else(|| E::invalid_value(de::Unexpected::Signed(v), &self))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                self.visit_i64(i64::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))?)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                T::from_f64(v).map(Sizing::Set).ok_or_else(|| E::invalid_value(de::Unexpected::Float(v), &self))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                T::from_bool(v).map(Sizing::Set).ok_or_else(|| E::invalid_value(de::Unexpected::Bool(v), &self))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                let v = v.trim();
                match v {
                    "auto" => return Ok(Sizing::Auto),
                    "true" | "false" => return self.visit_bool(v == "true"),
                    _ => {}
                }
                let bad = || E::invalid_value(de::Unexpected::Str(v), &self);
                match v.parse::<i64>() {
                    Ok(n) => self.visit_i64(n),
                    Err(_) => self.visit_f64(v.parse::<f64>().map_err(|_| bad())?),
                }
            }
        }
        d.deserialize_any(Visit(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::Sizing;

    #[derive(serde::Deserialize, serde::Serialize, Debug, PartialEq)]
    struct Both {
        tokens: Sizing<usize>,
        mib: Sizing<f64>,
    }

    #[test]
    fn auto_and_numbers_read_and_write_back_and_bad_values_are_refused() {
        let b: Both = toml::from_str("tokens = \"auto\"\nmib = 62000.5\n").unwrap();
        assert_eq!(b, Both { tokens: Sizing::Auto, mib: Sizing::Set(62000.5) });
        assert_eq!(toml::from_str::<Both>(&toml::to_string(&b).unwrap()).unwrap(), b);
        let b: Both = toml::from_str("tokens = \"16384\"\nmib = 3\n").unwrap();
        assert_eq!(b, Both { tokens: Sizing::Set(16384), mib: Sizing::Set(3.0) });
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Switch {
            on: Sizing<bool>,
        }
        for (text, want) in [("on = \"auto\"", Sizing::Auto), ("on = true", Sizing::Set(true)), ("on = \"false\"", Sizing::Set(false))] {
            assert_eq!(toml::from_str::<Switch>(text).unwrap().on, want, "{text}");
        }
        for bad in ["on = 1", "on = \"yes\"", "on = 0.5"] {
            let e = toml::from_str::<Switch>(bad).unwrap_err().to_string();
            assert!(e.contains("\"auto\", true or false"), "{bad}: {e}");
        }
        assert!(toml::from_str::<Both>("tokens = true\nmib = 1").unwrap_err().to_string().contains("\"auto\" or a"));
        for bad in ["tokens = -1\nmib = 1", "tokens = 1.5\nmib = 1", "tokens = \"lots\"\nmib = 1", "tokens = 1\nmib = -2.0", "tokens = 1\nmib = nan", "tokens = 1\nmib = inf"] {
            let e = toml::from_str::<Both>(bad).unwrap_err().to_string();
            assert!(e.contains("\"auto\" or a"), "{bad}: {e}");
        }
    }
}
