//! Targeted cache-control fields (RFC 9213): `CDN-Cache-Control`, and a field of the
//! operator's own, that speak to this cache alone and outrank `Cache-Control`.
//!
//! A targeted field is a Structured Field Dictionary (RFC 8941 §3.2): its members are the
//! cache directives, a bare key is `true`, `max-age=60` an Integer, `private="x"` a String.
//! A field that does not parse as a Dictionary, or that is empty, is ignored (RFC 9213 §2.2),
//! so the response's `Cache-Control` and `Expires` decide. The `sfv` crate parses it: it reads
//! bytes from the network, answers or gives up, never panics, and does work bounded by its
//! input (the property tests below hold it to that).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use http::{HeaderMap, HeaderName};

use super::parse::Directive;

/// `CDN-Cache-Control` (RFC 9213 §3), on every cache's target list by default.
pub(crate) static CDN_CACHE_CONTROL: HeaderName = HeaderName::from_static("cdn-cache-control");

/// The directives of the first field of `targets` (in order) that is present, valid and not
/// empty; `None` if there is none, and the response's `Cache-Control` and `Expires` decide
/// (RFC 9213 §2.1).
pub(crate) fn directives(headers: &HeaderMap, targets: &[HeaderName]) -> Option<Vec<Directive>> {
    targets.iter().find_map(|name| {
        // Several field lines are one comma-separated value (RFC 8941 §4.2).
        let mut lines = headers.get_all(name).iter().peekable();
        lines.peek()?;
        let mut value = Vec::new();
        for line in lines {
            if !value.is_empty() {
                value.extend_from_slice(b", ");
            }
            value.extend_from_slice(line.as_bytes());
        }
        dictionary(&value).filter(|members| !members.is_empty())
    })
}

/// A Dictionary's members as directives, in order, the last of duplicate keys winning in the
/// first one's place (RFC 8941 §4.2.2); `None` if `input` is not a valid Dictionary of RFC
/// 8941 (RFC 9213 §2.2 names it: no dates nor display strings of RFC 9651). A member that is
/// `false` (`?0`) is left out; parameters are ignored; an inner list's argument is empty (no
/// directive takes one), any other item's is its text: a number as `sfv` writes it, a
/// string's characters, a token, a byte sequence in base64.
fn dictionary(input: &[u8]) -> Option<Vec<Directive>> {
    let members: sfv::Dictionary = sfv::Parser::new(input)
        .with_version(sfv::Version::Rfc8941)
        .parse()
        .ok()?;
    let directives = members.into_iter().filter_map(|(key, member)| {
        let argument = match member {
            sfv::ListEntry::InnerList(_) => Some(String::new()),
            sfv::ListEntry::Item(item) => match item.bare_item {
                sfv::BareItem::Boolean(false) => return None,
                sfv::BareItem::Boolean(true) => None,
                sfv::BareItem::Integer(integer) => Some(integer.to_string()),
                sfv::BareItem::Decimal(decimal) => Some(decimal.to_string()),
                sfv::BareItem::String(string) => Some(string.as_str().to_owned()),
                sfv::BareItem::Token(token) => Some(token.as_str().to_owned()),
                sfv::BareItem::ByteSequence(bytes) => Some(STANDARD.encode(bytes)),
                // Refused by RFC 8941's parser; no directive would take one.
                sfv::BareItem::Date(_) | sfv::BareItem::DisplayString(_) => return None,
            },
        };
        let name = key.as_str().to_owned();
        Some(Directive { name, argument })
    });
    Some(directives.collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn parsed(input: &str) -> Option<Vec<(String, Option<String>)>> {
        dictionary(input.as_bytes())
            .map(|members| members.into_iter().map(|d| (d.name, d.argument)).collect())
    }

    fn member(name: &str, argument: Option<&str>) -> (String, Option<String>) {
        (name.to_owned(), argument.map(str::to_owned))
    }

    #[test]
    fn rfc_9213_examples_parse_as_dictionaries() {
        assert_eq!(
            parsed("max-age=60, must-revalidate"),
            Some(vec![
                member("max-age", Some("60")),
                member("must-revalidate", None)
            ])
        );
        assert_eq!(
            parsed("  no-store ,private=\"x-user\";p=1, stale-if-error=?1,no-cache=?0 "),
            Some(vec![
                member("no-store", None),
                member("private", Some("x-user")),
                member("stale-if-error", None),
            ])
        );
        // The last of duplicate keys wins, in the first one's place (RFC 8941 §4.2.2).
        assert_eq!(
            parsed("max-age=5, public, max-age=7"),
            Some(vec![member("max-age", Some("7")), member("public", None)])
        );
        assert_eq!(parsed(""), Some(vec![]));
        assert_eq!(
            parsed("a=(1 2);x, b=:AQ==:, c=tok/en, d=-1.5"),
            Some(vec![
                member("a", Some("")),
                member("b", Some("AQ==")),
                member("c", Some("tok/en")),
                member("d", Some("-1.5")),
            ])
        );
    }

    #[test]
    fn invalid_dictionaries_are_refused() {
        for bad in [
            "Max-Age=60",
            "max-age=60,",
            "max-age=60 public",
            "max-age=\"60",
            "max-age=1234567890123456",
            "max-age=1.2345",
            "private=\"a\\b\"",
            "a=?2",
            ",a",
            "a=(1 2",
            "a=:no base64:",
            "max-age=60;",
        ] {
            assert_eq!(parsed(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_first_valid_non_empty_target_is_used() {
        let stampede = HeaderName::from_static("stampede-cache-control");
        let targets = [stampede.clone(), CDN_CACHE_CONTROL.clone()];
        let mut headers = HeaderMap::new();
        assert_eq!(directives(&headers, &targets), None);
        headers.append(&CDN_CACHE_CONTROL, HeaderValue::from_static("max-age=30"));
        headers.append(&CDN_CACHE_CONTROL, HeaderValue::from_static("public"));
        let names = |d: Option<Vec<Directive>>| {
            d.map(|d| d.into_iter().map(|d| d.name).collect::<Vec<_>>())
        };
        assert_eq!(
            names(directives(&headers, &targets)),
            Some(vec!["max-age".to_owned(), "public".to_owned()]),
            "field lines are joined"
        );
        headers.insert(&stampede, HeaderValue::from_static("max-age=\"x"));
        assert_eq!(
            names(directives(&headers, &targets)),
            Some(vec!["max-age".to_owned(), "public".to_owned()]),
            "an invalid field is ignored"
        );
        headers.insert(&stampede, HeaderValue::from_static(" "));
        assert_eq!(
            names(directives(&headers, &targets)).map(|n| n.len()),
            Some(2),
            "an empty field is ignored"
        );
        headers.insert(&stampede, HeaderValue::from_static("no-store"));
        assert_eq!(
            names(directives(&headers, &targets)),
            Some(vec!["no-store".to_owned()])
        );
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_parse_or_are_refused(input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
            let _ = dictionary(&input);
        }

        #[test]
        fn near_dictionaries_parse_or_are_refused(
            input in "[a-z0-9 ,;=\"?():*.\\-\\\\/]{0,60}"
        ) {
            if let Some(members) = dictionary(input.as_bytes()) {
                for directive in members {
                    proptest::prop_assert!(!directive.name.is_empty());
                }
            }
        }
    }
}
