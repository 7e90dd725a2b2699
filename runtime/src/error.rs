//! How an error is shown: its own message, then each cause's after `: `, as `anyhow` shows a
//! chain with `{:#}`. Every error type of the runtime and of `ppc-tensor` follows one rule: an
//! error either returns its cause from `source()` or puts it in its message, never both; so a
//! chain shows each thing once, and generated executables print errors with [`Chain`].

use std::error::Error;
use std::fmt;

/// Displays an error and its causes: `cannot read data.safetensors: No such file or directory`.
pub struct Chain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Chain;
    use crate::safetensors::FileError;

    #[test]
    fn a_chain_shows_each_cause_once_after_a_colon() {
        let e = FileError::Read {
            path: "data.safetensors".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "gone"),
        };
        assert_eq!(Chain(&e).to_string(), "cannot read data.safetensors: gone");
    }
}
