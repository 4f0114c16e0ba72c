//! A namespace's tag state on Redis: one hash holding its tags' versions, its clock and its
//! generation (see `crate::store::tags` for why a lost hash starts a new generation), read
//! and changed by the calls below, each one round trip.

use super::names::tag_state_name;
use super::names::CLEARED;
use super::scripts::{command, script_call, CLEAR, INVALIDATE_TAGS, TAG_CLOCK};
use super::RedisStore;
use crate::store::{
    tags, BoxFuture, KeyDigest, StoreError, StoreErrorKind, StoreKey, TagClock, TagVersions,
    MAX_TAG_VERSIONS,
};

impl RedisStore {
    pub(super) fn read_tag_clock(
        &self,
        namespace: &str,
    ) -> BoxFuture<'_, Result<TagClock, StoreError>> {
        let mut call = script_call(&TAG_CLOCK, &[tag_state_name(namespace)]);
        call.arg(tags::generation_text(tags::new_generation()))
            .arg(tag_state_fields());
        Box::pin(async move {
            let (generation, clock): (Vec<u8>, Vec<u8>) = self.run(&TAG_CLOCK, &call).await?;
            match (tags::parse_generation(&generation), counter(&clock)) {
                (Some(generation), Some(clock)) => Ok(TagClock { generation, clock }),
                _ => Err(StoreError::of_kind(
                    StoreErrorKind::Protocol,
                    "a tag state that is not this crate's",
                )),
            }
        })
    }

    pub(super) fn read_tag_versions(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<Option<TagVersions>, StoreError>> {
        let state = tag_state_name(namespace);
        let mut call = command(3 + tags.len(), "HMGET", state.as_str());
        call.arg("g");
        for tag in tags {
            call.arg(&tag.hex_bytes()[..]);
        }
        Box::pin(async move {
            let mut fields: Vec<Option<Vec<u8>>> = self
                .connection
                .query(&call)
                .await
                .map_err(|error| self.error(error))?;
            // No generation (or one this crate did not write): no tag state, every tagged
            // value is outdated.
            let generation = match fields.first_mut().and_then(Option::take) {
                Some(generation) => tags::parse_generation(&generation),
                None => None,
            };
            // A version that is not a number was not written by this crate: the values of its
            // tag count as invalidated (a miss, then reloaded), never as valid.
            Ok(generation.map(|generation| TagVersions {
                generation,
                versions: fields
                    .into_iter()
                    .skip(1)
                    .map(|version| version.map_or(0, |bytes| counter(&bytes).unwrap_or(u64::MAX)))
                    .collect(),
            }))
        })
    }

    pub(super) fn invalidate_tags_now(
        &self,
        namespace: &str,
        tags: &[KeyDigest],
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut call = script_call(&INVALIDATE_TAGS, &[tag_state_name(namespace)]);
        call.arg(self.fill_channel(namespace))
            .arg(self.origin())
            .arg(tags::generation_text(tags::new_generation()))
            .arg(tag_state_fields());
        for tag in tags {
            call.arg(&tag.hex_bytes()[..]);
        }
        let keys: Vec<StoreKey> = tags
            .iter()
            .map(|tag| StoreKey::new(std::sync::Arc::from(namespace), *tag))
            .collect();
        Box::pin(async move {
            let ran: Result<i64, StoreError> = self.run(&INVALIDATE_TAGS, &call).await;
            // Whatever the answer: the change may have been made.
            for key in &keys {
                self.changed_here(key);
            }
            ran.map(drop)
        })
    }
}

impl RedisStore {
    pub(super) fn clear_now(&self, namespace: &str) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut call = script_call(&CLEAR, &[tag_state_name(namespace)]);
        call.arg(self.fill_channel(namespace))
            .arg(self.origin())
            .arg(tags::generation_text(tags::new_generation()))
            .arg(CLEARED);
        Box::pin(async move {
            let ran: Result<i64, StoreError> = self.run(&CLEAR, &call).await;
            // Whatever the answer: the change may have been made.
            self.cleared_here();
            ran.map(drop)
        })
    }
}

/// The most fields a namespace's tag state keeps: its tags' versions, its generation and
/// its clock.
fn tag_state_fields() -> usize {
    MAX_TAG_VERSIONS + 2
}

/// A counter as Redis writes it (decimal digits).
fn counter(bytes: &[u8]) -> Option<u64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}
