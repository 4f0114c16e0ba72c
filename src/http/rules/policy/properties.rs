//! A property of the policy: whatever bytes a response's deciding fields hold, it decides,
//! within the longest lifetime a header can give.

use http::{HeaderValue, Response};

use super::tests::request;
use super::*;
use crate::http::rules::parse::age;
use proptest::strategy::Strategy;

proptest::proptest! {
    /// Whatever bytes the response's deciding fields hold, the policy decides, and never
    /// for longer than the longest lifetime a header can give.
    #[test]
    fn any_response_headers_get_a_decision(
        fields in proptest::collection::vec(
            (
                proptest::sample::select(vec![
                    "cache-control", "expires", "date", "age", "vary", "set-cookie",
                ]),
                proptest::prop_oneof![
                    // Any bytes a value may hold.
                    proptest::collection::vec(
                        proptest::prop_oneof![0x20u8..0x7f, 0x80u8..=0xff],
                        0..60,
                    ),
                    // Or something close to what these fields hold.
                    proptest::string::string_regex(
                        "(public|private|no-cache|no-store|s-maxage=[0-9]{0,12}|max-age=\"?[0-9]{0,25}\"?|[0-9]{1,12}|Sun, 06 Nov 1994 08:49:37 GMT|accept|\\*|[ ,=\"])*"
                    )
                    .expect("a valid regex")
                    .prop_map(String::into_bytes),
                ],
            ),
            0..8,
        ),
        status in 100u16..600,
        authorized in proptest::bool::ANY,
    ) {
        let mut response = Response::new(());
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        for (name, bytes) in fields {
            if let Ok(value) = HeaderValue::from_bytes(&bytes) {
                response.headers_mut().append(name, value);
            }
        }
        let (response, ()) = response.into_parts();
        let request = if authorized {
            request(&[("authorization", "Bearer a")])
        } else {
            request(&[])
        };
        let policy = RfcPolicy::new().default_ttl(Duration::from_secs(60));
        if let Decision::Store(ttl) = policy.decide(&request, &response) {
            proptest::prop_assert!(!ttl.is_zero() && ttl <= Duration::from_secs(1 << 31));
        }
        let _ = age(&response.headers);
    }
}
