//! `Forwarded` (RFC 7239) as a variant key reads it: without what names the client.

use std::borrow::Cow;

/// A `Forwarded` field value (RFC 7239 §4) without its `for=` and `by=` parameters, in any
/// element: they name the client and the proxy that received it, which differ per client,
/// not the page. The other parameters (`host=`, `proto=`, extensions) stay as sent, their
/// names in lowercase (§4: case-insensitive); elements left empty are dropped. A `,` or `;`
/// inside a quoted string separates nothing.
pub(super) fn without_for_and_by(value: &[u8]) -> Cow<'_, [u8]> {
    let mut kept: Vec<u8> = Vec::with_capacity(value.len());
    for element in split_unquoted(value, b',') {
        let mut first_pair = true;
        for pair in split_unquoted(element, b';').map(<[u8]>::trim_ascii) {
            let name = pair
                .split(|&b| b == b'=')
                .next()
                .unwrap_or(pair)
                .trim_ascii();
            if pair.is_empty()
                || name.eq_ignore_ascii_case(b"for")
                || name.eq_ignore_ascii_case(b"by")
            {
                continue;
            }
            match (first_pair, kept.is_empty()) {
                (true, true) => {}
                (true, false) => kept.push(b','),
                (false, _) => kept.push(b';'),
            }
            first_pair = false;
            kept.extend(name.to_ascii_lowercase());
            kept.extend_from_slice(&pair[name.len()..]);
        }
    }
    if kept == value {
        Cow::Borrowed(value)
    } else {
        Cow::Owned(kept)
    }
}

/// The parts of `value` between `separator`s that are not inside a quoted string.
fn split_unquoted(value: &[u8], separator: u8) -> impl Iterator<Item = &[u8]> {
    let (mut quoted, mut escaped) = (false, false);
    value.split(move |&b| {
        if escaped {
            escaped = false;
        } else if quoted && b == b'\\' {
            escaped = true;
        } else if b == b'"' {
            quoted = !quoted;
        } else if !quoted && b == separator {
            return true;
        }
        false
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_is_keyed_without_for_and_by_rfc_7239() {
        let cases: [(&str, &str); 7] = [
            ("host=a.example;proto=https", "host=a.example;proto=https"),
            ("for=192.0.2.1;proto=https", "proto=https"),
            ("For=192.0.2.1; Proto=https; by=10.0.0.1", "proto=https"),
            ("for=192.0.2.1", ""),
            (
                "for=192.0.2.1;host=a, for=198.51.100.7;proto=https",
                "host=a,proto=https",
            ),
            (
                "for=\"[2001:db8::1]:4711\";host=\"a;b,c\"",
                "host=\"a;b,c\"",
            ),
            ("for=1, for=2", ""),
        ];
        for (value, keyed) in cases {
            assert_eq!(
                without_for_and_by(value.as_bytes()).as_ref(),
                keyed.as_bytes(),
                "{value}"
            );
        }
        assert!(matches!(
            without_for_and_by(b"host=a;proto=https"),
            Cow::Borrowed(_)
        ));
    }
}
