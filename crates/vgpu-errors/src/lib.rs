//! The one error-chain formatter: an error and each of its sources on one
//! line, `outer: cause: root cause`, the shape every vgpu message uses.
//!
//! Allocates one `String`; owns nothing else and depends on nothing, so
//! the interposer, the simulator, the tools and the tests can all use it.
use std::error::Error;
use std::fmt;

/// `e` and its sources, joined by `": "`.
pub fn chain(e: &dyn Error) -> String {
    Chain(e).to_string()
}

/// Displays an error with its sources, joined by `": "`, without
/// building a `String` first (for `format!`/`write!`).
pub struct Chain<'a>(pub &'a dyn Error);

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut src = self.0.source();
        while let Some(c) = src {
            write!(f, ": {c}")?;
            src = c.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl fmt::Display for E {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl Error for E {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref().map(|e| e as &(dyn Error + 'static))
        }
    }

    #[test]
    fn joins_every_source_in_order() {
        let e = E(
            "open region",
            Some(Box::new(E("read header", Some(Box::new(E("EIO", None)))))),
        );
        assert_eq!(chain(&e), "open region: read header: EIO");
        assert_eq!(chain(&E("alone", None)), "alone");
        assert_eq!(
            format!("[{}]", Chain(&e)),
            "[open region: read header: EIO]"
        );
    }
}
