//! Header field names given to the layer's setters as text: one argument type for every setter
//! that takes a name (`&str`, `String`, `HeaderName`: anything that is `AsRef<str>`).

use http::HeaderName;
use tracing::error;

/// `name` as a header field name (ASCII case does not matter), or `None`, with an error
/// logged, for one that is not a field name. Ignoring such a name is safe whatever the setter
/// does with it: no request or response can carry a field of that name.
pub(crate) fn field_name(setter: &'static str, name: &str) -> Option<HeaderName> {
    match HeaderName::from_bytes(name.trim().as_bytes()) {
        Ok(name) => Some(name),
        Err(_) => {
            error!(setter, name, "not a header field name: ignored");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_in_any_case_and_bad_ones_are_none() {
        assert_eq!(
            field_name("t", "X-Forwarded-Proto"),
            Some(HeaderName::from_static("x-forwarded-proto"))
        );
        assert_eq!(
            field_name("t", " x-theme "),
            Some(HeaderName::from_static("x-theme"))
        );
        assert_eq!(field_name("t", "bad name"), None);
        assert_eq!(field_name("t", ""), None);
    }
}
