//! Targeted cache-control fields (RFC 9213): `CDN-Cache-Control`, and a field of the
//! operator's own, that speak to this cache alone and outrank `Cache-Control`.
//!
//! A targeted field is a Structured Field Dictionary (RFC 8941 §3.2): its members are the
//! cache directives, a bare key is `true`, `max-age=60` an Integer, `private="x"` a String.
//! A field that does not parse as a Dictionary, or that is empty, is ignored (RFC 9213 §2.2),
//! so the response's `Cache-Control` and `Expires` decide. The parser reads bytes from the
//! network: it answers or gives up, never panics, and does work bounded by its input.

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

/// A Dictionary's members as directives, in order, the last of duplicate keys winning (RFC
/// 8941 §4.2.2); `None` if `input` is not a valid Dictionary. A member that is `false` (`?0`)
/// is left out; parameters are ignored.
fn dictionary(input: &[u8]) -> Option<Vec<Directive>> {
    let mut parser = Parser {
        input: trim_sp(input),
        at: 0,
    };
    let mut members: Vec<(String, Option<Option<String>>)> = Vec::new();
    while !parser.done() {
        let key = parser.key()?;
        let value = if parser.eat(b'=') {
            parser.item_or_inner_list()?
        } else {
            parser.parameters()?;
            Some(None)
        };
        match members.iter_mut().find(|(k, _)| *k == key) {
            Some(member) => member.1 = value,
            None => members.push((key, value)),
        }
        parser.skip_ows();
        if parser.done() {
            break;
        }
        if !parser.eat(b',') {
            return None;
        }
        parser.skip_ows();
        if parser.done() {
            // A trailing comma.
            return None;
        }
    }
    Some(
        members
            .into_iter()
            .filter_map(|(name, value)| value.map(|argument| Directive { name, argument }))
            .collect(),
    )
}

/// `input` without leading and trailing spaces (RFC 8941 §4.2).
fn trim_sp(input: &[u8]) -> &[u8] {
    let start = input.iter().position(|&b| b != b' ').unwrap_or(input.len());
    let end = input
        .iter()
        .rposition(|&b| b != b' ')
        .map_or(start, |i| i + 1);
    input.get(start..end).unwrap_or_default()
}

struct Parser<'a> {
    input: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn done(&self) -> bool {
        self.at >= self.input.len()
    }

    fn peek(&self) -> Option<u8> {
        self.input.get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        let ate = self.peek() == Some(byte);
        if ate {
            self.at += 1;
        }
        ate
    }

    fn skip_sp(&mut self) {
        while self.eat(b' ') {}
    }

    fn skip_ows(&mut self) {
        while self.eat(b' ') || self.eat(b'\t') {}
    }

    /// A key: `( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )`.
    fn key(&mut self) -> Option<String> {
        let start = self.at;
        match self.peek()? {
            b'a'..=b'z' | b'*' => self.at += 1,
            _ => return None,
        }
        while let Some(b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' | b'*') = self.peek() {
            self.at += 1;
        }
        let key = self.input.get(start..self.at)?;
        Some(String::from_utf8_lossy(key).into_owned())
    }

    /// A member's value: `Some(None)` for `true`, `None` for `false`, else its text (an inner
    /// list's is empty: no directive takes one).
    fn item_or_inner_list(&mut self) -> Option<Option<Option<String>>> {
        if self.eat(b'(') {
            loop {
                self.skip_sp();
                if self.eat(b')') {
                    break;
                }
                self.bare_item()?;
                self.parameters()?;
                match self.peek()? {
                    b' ' | b')' => {}
                    _ => return None,
                }
            }
            self.parameters()?;
            return Some(Some(Some(String::new())));
        }
        let item = self.bare_item()?;
        self.parameters()?;
        Some(match item {
            Bare::Boolean(true) => Some(None),
            Bare::Boolean(false) => None,
            Bare::Text(text) => Some(Some(text)),
        })
    }

    /// Parameters (`;key[=item]`), checked and dropped.
    fn parameters(&mut self) -> Option<()> {
        while self.eat(b';') {
            self.skip_sp();
            self.key()?;
            if self.eat(b'=') {
                self.bare_item()?;
            }
        }
        Some(())
    }

    fn bare_item(&mut self) -> Option<Bare> {
        match self.peek()? {
            b'-' | b'0'..=b'9' => self.number().map(Bare::Text),
            b'"' => self.string().map(Bare::Text),
            b'A'..=b'Z' | b'a'..=b'z' | b'*' => Some(Bare::Text(self.token())),
            b':' => self.byte_sequence().map(Bare::Text),
            b'?' => {
                self.at += 1;
                let value = match self.peek()? {
                    b'0' => false,
                    b'1' => true,
                    _ => return None,
                };
                self.at += 1;
                Some(Bare::Boolean(value))
            }
            _ => None,
        }
    }

    /// An Integer (at most 15 digits) or a Decimal (at most 12 digits, a dot, 1 to 3 digits),
    /// as written.
    fn number(&mut self) -> Option<String> {
        let start = self.at;
        self.eat(b'-');
        let digits_start = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        let integer = self.at - digits_start;
        if integer == 0 {
            return None;
        }
        if self.eat(b'.') {
            let fraction_start = self.at;
            while let Some(b'0'..=b'9') = self.peek() {
                self.at += 1;
            }
            let fraction = self.at - fraction_start;
            if integer > 12 || !(1..=3).contains(&fraction) {
                return None;
            }
        } else if integer > 15 {
            return None;
        }
        let text = self.input.get(start..self.at)?;
        Some(String::from_utf8_lossy(text).into_owned())
    }

    /// A String: visible ASCII and spaces in quotes, with `\"` and `\\` escapes.
    fn string(&mut self) -> Option<String> {
        self.at += 1;
        let mut out = String::new();
        loop {
            let byte = self.peek()?;
            self.at += 1;
            match byte {
                b'"' => return Some(out),
                b'\\' => match self.peek()? {
                    escaped @ (b'"' | b'\\') => {
                        self.at += 1;
                        out.push(char::from(escaped));
                    }
                    _ => return None,
                },
                0x20..=0x7e => out.push(char::from(byte)),
                _ => return None,
            }
        }
    }

    /// A Token: `( ALPHA / "*" ) *( tchar / ":" / "/" )`; the first byte is checked already.
    fn token(&mut self) -> String {
        let start = self.at;
        self.at += 1;
        while let Some(byte) = self.peek() {
            let tchar = byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&byte);
            if !tchar {
                break;
            }
            self.at += 1;
        }
        let text = self.input.get(start..self.at).unwrap_or_default();
        String::from_utf8_lossy(text).into_owned()
    }

    /// A Byte Sequence, `:base64:`, as written between the colons.
    fn byte_sequence(&mut self) -> Option<String> {
        self.at += 1;
        let start = self.at;
        while let Some(byte) = self.peek() {
            if byte == b':' {
                let text = self.input.get(start..self.at)?;
                self.at += 1;
                return Some(String::from_utf8_lossy(text).into_owned());
            }
            if !(byte.is_ascii_alphanumeric() || b"+/=".contains(&byte)) {
                return None;
            }
            self.at += 1;
        }
        None
    }
}

/// A bare item, as a directive reads it.
enum Bare {
    Boolean(bool),
    /// An Integer, Decimal, String, Token or Byte Sequence, as text.
    Text(String),
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
