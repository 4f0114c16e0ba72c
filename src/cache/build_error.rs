//! [`BuildError`]: a setting of the [`CacheBuilder`](super::CacheBuilder) that cannot work,
//! and the checks that find it.

use std::fmt;
use std::time::Duration;

use super::config::Config;

/// A setting of the [`CacheBuilder`](super::CacheBuilder) that cannot work, refused by
/// [`try_build`](super::CacheBuilder::try_build) (and [`build`](super::CacheBuilder::build),
/// which panics with it). `Display` names the setter and says why:
///
/// ```
/// use std::time::Duration;
/// use tower_stampede::{store::MemoryStore, Cache};
///
/// let refused = Cache::builder(MemoryStore::new())
///     .lock_ttl(Duration::ZERO)
///     .try_build()
///     .unwrap_err();
/// assert_eq!(refused.setting(), "lock_ttl");
/// assert_eq!(
///     refused.to_string(),
///     "CacheBuilder::lock_ttl(0ns) cannot work: a reload lock must live at least 1 ms \
///      (Redis counts its life in milliseconds)"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildError {
    setting: &'static str,
    value: Duration,
    why: &'static str,
}

impl BuildError {
    /// The setter whose value cannot work, as named in [`CacheBuilder`](super::CacheBuilder)
    /// (`"lock_ttl"`).
    pub fn setting(&self) -> &'static str {
        self.setting
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CacheBuilder::{}({:?}) cannot work: {}",
            self.setting, self.value, self.why
        )
    }
}

impl std::error::Error for BuildError {}

/// The shortest life the store can give a value or a lock: Redis counts in milliseconds, and
/// `PX 0` is an error.
const MILLISECOND: Duration = Duration::from_millis(1);

/// The first setting of `config` that cannot work, if any.
pub(super) fn check(config: &Config) -> Result<(), BuildError> {
    let refuse = |setting, value, why| {
        Err(BuildError {
            setting,
            value,
            why,
        })
    };
    let loads = &config.loads;
    if config.lives.ttl < MILLISECOND {
        return refuse(
            "ttl",
            config.lives.ttl,
            "a value must stay fresh at least 1 ms (Redis counts its life in milliseconds)",
        );
    }
    if loads.lock_ttl < MILLISECOND {
        return refuse(
            "lock_ttl",
            loads.lock_ttl,
            "a reload lock must live at least 1 ms (Redis counts its life in milliseconds)",
        );
    }
    if loads.load_timeout.is_zero() {
        return refuse(
            "load_timeout",
            loads.load_timeout,
            "every load would be abandoned as it starts",
        );
    }
    if config.breaker.store_timeout.is_zero() {
        return refuse(
            "store_timeout",
            config.breaker.store_timeout,
            "every store call would time out as it is made",
        );
    }
    match loads.soft_timeout {
        Some(soft) if soft >= loads.load_timeout => refuse(
            "soft_timeout",
            soft,
            "it is not shorter than load_timeout, so the load it waits for is abandoned first",
        ),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_work() {
        assert_eq!(check(&Config::default()), Ok(()));
    }

    #[test]
    fn a_soft_timeout_below_the_load_timeout_works() {
        let mut config = Config::default();
        config.loads.soft_timeout = Some(config.loads.load_timeout - MILLISECOND);
        assert_eq!(check(&config), Ok(()));
    }
}
