//! The Lua scripts of `RedisStore` (one `static` [`Script`] each, run by `EVALSHA`), and how
//! the commands and script calls of a store call are built.
//!
//! What the lock key of a value holds, which every script and the pipelined lookup rely on, is
//! described in the [module docs](super).

use std::sync::LazyLock;

use redis::{Cmd, Script, ToRedisArgs};

use super::names::SHARD_TAGS;
use crate::store::key::{LockToken, StoreKey};

/// Get the value; if absent or about to expire, try to take the lock (a `fresh` marker does not
/// stop it: this script also serves the lookups that take the lock before the value is stale).
/// A value of a foreign type (`WRONGTYPE`) counts as absent, so the fill overwrites it, and a
/// lock key of a foreign type, or holding a string that is no lock (see [`is_lock`]), counts
/// as free; so does a lock that lapsed (its remaining life is within the time it is kept
/// lapsed, its third field: see [`lock_value`]). A lock that already holds our token (the first 33 bytes of `ARGV[1]`) is ours,
/// taken again (its bound and TTL renewed): the pipelined lookup took it before a `GET` of a
/// foreign type failed, or the caller asks again. Reply:
/// `{value, pttl, state}` with `pttl = -2` when absent and state 0 = not requested,
/// 1 = acquired, 2 = held elsewhere, 3 = held by the marker of a failed load.
pub(super) static LOOKUP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local v = redis.pcall('GET', KEYS[1])
if type(v) ~= 'string' then v = false end
local ttl = -2
if v then
  ttl = redis.call('PTTL', KEYS[1])
  if ttl > tonumber(ARGV[3]) then return {v, ttl, 0} end
else
  v = ''
end
local l = redis.pcall('GET', KEYS[2])
if l == 'failed' then return {v, ttl, 3} end
local kept = type(l) == 'string' and tonumber(string.match(l, '^%x+:%d+:(%d+)'))
if type(l) ~= 'string' or l == 'fresh' or string.sub(l, 1, 33) == string.sub(ARGV[1], 1, 33)
    or not string.match(l, '^' .. string.rep('%x', 32) .. ':')
    or (kept and redis.call('PTTL', KEYS[2]) <= kept) then
  redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
  return {v, ttl, 1}
end
return {v, ttl, 2}
",
    )
});

/// The lock functions the fenced scripts share.
///
/// `owns(lock)`: whether the lock (`KEYS[2]` in `FILL`, `RELEASE`; `KEYS[1]` in the others) is
/// held by the token `ARGV[1]`, as `<token>:<refresh below>`, and the lock's value.
/// `unlock(lock, l, life)`: frees the held lock `l`, leaving the `fresh` marker in its place for
/// as long as a value with `life` ms left stays fresh (above the lock's refresh bound), or
/// nothing once it is not.
const LOCK_FUNCTIONS: &str = r"
local function owns(lock)
  local l = redis.call('GET', lock)
  return l and string.sub(l, 1, 33) == ARGV[1] .. ':', l
end
local function unlock(lock, l, life)
  local fresh = life - (tonumber(string.match(l, '^%x+:(%d+)')) or math.huge)
  if fresh >= 1 then
    redis.call('SET', lock, 'fresh', 'PX', fresh)
  else
    redis.call('DEL', lock)
  end
end
";

/// `publish(channel, message)`, which every script that changes a key calls: a classic
/// channel gets a `PUBLISH`; a shard channel family (`<channel>{`, on a cluster: see
/// [`SHARD_TAGS`]) gets an `SPUBLISH` on the first of its channels this node serves (the others
/// answer an error and publish nothing), or, where none is served here or the server has no
/// sharded pub/sub, a `PUBLISH` on the classic channel.
fn publish_function() -> String {
    let tags: Vec<String> = SHARD_TAGS.iter().map(|tag| format!("'{tag}'")).collect();
    format!(
        r"
local function publish(channel, message)
  if string.sub(channel, -1) == '{{' then
    for _, tag in ipairs({{{tags}}}) do
      if type(redis.pcall('SPUBLISH', channel .. tag .. '}}', message)) == 'number' then
        return
      end
    end
    channel = string.sub(channel, 1, -2)
  end
  redis.call('PUBLISH', channel, message)
end
",
        tags = tags.join(",")
    )
}

/// A script of `functions` (Lua function definitions) and the publish function, then `body`.
fn publishing(functions: &str, body: &str) -> Script {
    Script::new(&format!("{functions}{}{body}", publish_function()))
}

/// `load_start(bytes)`: the load start of an entry the engine wrote, as
/// [`load_start`](crate::store::load_start) reads it from its first 16 bytes; `nil` for other
/// bytes (or not a string).
const LOAD_START_FUNCTIONS: &str = r"
local function load_start(head)
  if type(head) ~= 'string' or #head < 16 or string.sub(head, 1, 2) ~= 'TS'
      or string.byte(head, 3) < 2 then
    return nil
  end
  local start = 0
  for i = 9, 16 do start = start * 256 + string.byte(head, i) end
  return start
end
";

/// Fenced write: store the value only while the lock holds our token, then replace the lock
/// by the `fresh` marker for as long as the value is fresh, and publish "filled" (`ARGV[4]` is
/// the channel, `ARGV[5]` the key's digest). Fenced by load starts too: where the stored
/// value's load started later than the filled value's, the stored value stays (2), and the
/// lock is freed and "filled" published all the same.
pub(super) static FILL: LazyLock<Script> = LazyLock::new(|| {
    publishing(
        &format!("{LOCK_FUNCTIONS}{LOAD_START_FUNCTIONS}"),
        r"
local held, l = owns(KEYS[2])
if not held then return 0 end
local new = load_start(ARGV[2])
local stored = new and load_start(redis.pcall('GETRANGE', KEYS[1], 0, 15))
if stored and stored > new then
  unlock(KEYS[2], l, redis.call('PTTL', KEYS[1]))
  publish(ARGV[4], ARGV[5])
  return 2
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
unlock(KEYS[2], l, tonumber(ARGV[3]))
publish(ARGV[4], ARGV[5])
return 1
",
    )
});

/// Fenced answer for a load's waiters, beside the value: while the lock holds our token,
/// keep the answer (`ARGV[2]`) for `ARGV[3]` ms in the waiters' key (`KEYS[3]`), leave the
/// value (`KEYS[1]`) as it is, free the lock as `RELEASE` does, and publish (`ARGV[4]`,
/// `ARGV[5]`).
pub(super) static ANSWER: LazyLock<Script> = LazyLock::new(|| {
    publishing(
        LOCK_FUNCTIONS,
        r"
local held, l = owns(KEYS[2])
if not held then return 0 end
redis.call('SET', KEYS[3], ARGV[2], 'PX', ARGV[3])
unlock(KEYS[2], l, redis.call('PTTL', KEYS[1]))
publish(ARGV[4], ARGV[5])
return 1
",
    )
});

/// Fenced renewal: while the lock holds our token, set the value (`KEYS[1]`) to expire in
/// `ARGV[2]` ms without rewriting it (its load start too), replace the lock by the `fresh`
/// marker as a fill does, and publish (`ARGV[3]`, `ARGV[4]`). Reply: 1 renewed, 0 the lock is
/// not ours, 2 no value (the lock is kept: the leader fills instead).
pub(super) static RENEW: LazyLock<Script> = LazyLock::new(|| {
    publishing(
        LOCK_FUNCTIONS,
        r"
local held, l = owns(KEYS[2])
if not held then return 0 end
if redis.call('PEXPIRE', KEYS[1], ARGV[2]) == 0 then return 2 end
unlock(KEYS[2], l, tonumber(ARGV[2]))
publish(ARGV[3], ARGV[4])
return 1
",
    )
});

/// Compare-and-release of the lock (`KEYS[2]`, token `ARGV[1]`), which `RELEASE` and
/// `REPAIR` share: the `fresh` marker takes its place if the value is still fresh, else the
/// lock is deleted.
const RELEASE_LOCK: &str = r"
local held, l = owns(KEYS[2])
if not held then return 0 end
unlock(KEYS[2], l, redis.call('PTTL', KEYS[1]))
";

/// Compare-and-release of the lock, then publish "filled" so followers retry at once.
pub(super) static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    publishing(
        LOCK_FUNCTIONS,
        &format!("{RELEASE_LOCK}publish(ARGV[2], ARGV[3])\nreturn 1\n"),
    )
});

/// The `fresh` marker put back: a lookup that found a fresh value without its marker (evicted,
/// expired with a failure marker, or never set by a put) took the lock, and frees it as
/// `RELEASE` does, but without publishing: nothing changed, and a notification would make
/// every process drop the key from its L1.
pub(super) static REPAIR: LazyLock<Script> =
    LazyLock::new(|| Script::new(&format!("{LOCK_FUNCTIONS}{RELEASE_LOCK}return 1\n")));

/// Compare-and-replace of the lock by the failure marker (`failed`, which no lock equals),
/// then publish so followers fail at once.
pub(super) static FAIL: LazyLock<Script> = LazyLock::new(|| {
    publishing(
        LOCK_FUNCTIONS,
        r"
if not owns(KEYS[1]) then return 0 end
redis.call('SET', KEYS[1], 'failed', 'PX', ARGV[2])
publish(ARGV[3], ARGV[4])
return 1
",
    )
});

/// Write of the value whatever the lock holds, fenced by load starts: refused (0) where the
/// stored value's load started later than `ARGV[5]` (ms since the epoch; empty for a value
/// without one), as [`load_start`](crate::store::load_start) reads it from the first 16
/// bytes; else publish "filled".
pub(super) static PUT: LazyLock<Script> = LazyLock::new(|| {
    publishing(
        LOAD_START_FUNCTIONS,
        r"
local new = tonumber(ARGV[5])
local stored = new and load_start(redis.pcall('GETRANGE', KEYS[1], 0, 15))
if stored and stored > new then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
publish(ARGV[3], ARGV[4])
return 1
",
    )
});

/// Removes the value and voids whatever the lock key holds (a leader's lock, whose fill is
/// then refused; a failure or `fresh` marker), then publishes, as a fill does. `KEYS[1]` is
/// the value, `KEYS[2]` the lock; `ARGV[1]` and `ARGV[2]` the channel and digest.
pub(super) static INVALIDATE: LazyLock<Script> = LazyLock::new(|| {
    publishing(
        "",
        r"
redis.call('DEL', KEYS[1], KEYS[2])
publish(ARGV[1], ARGV[2])
return 1
",
    )
});

/// Writes the value (`ARGV[1]`) for `ARGV[2]` ms and voids the lock, leaving the `fresh`
/// marker for the value's freshness (`ARGV[3]` ms, none if 0), then publishes (`ARGV[4]`,
/// `ARGV[5]`); fenced as [`PUT`] is: refused (0) where the stored value was written (or its
/// load started) later than `ARGV[6]`, so that a write delayed on the way never undoes a
/// newer one.
pub(super) static SET: LazyLock<Script> = LazyLock::new(|| {
    publishing(
        LOAD_START_FUNCTIONS,
        r"
local new = tonumber(ARGV[6])
local stored = new and load_start(redis.pcall('GETRANGE', KEYS[1], 0, 15))
if stored and stored > new then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local fresh = tonumber(ARGV[3])
if fresh >= 1 then
  redis.call('SET', KEYS[2], 'fresh', 'PX', fresh)
else
  redis.call('DEL', KEYS[2])
end
publish(ARGV[4], ARGV[5])
return 1
",
    )
});

/// Ends the value's freshness: keeps it at most `ARGV[1]` ms longer (removes it if 0) and voids
/// the lock, then publishes (`ARGV[2]`, `ARGV[3]`). A value without expiry (a foreign write)
/// gets one.
pub(super) static EXPIRE: LazyLock<Script> = LazyLock::new(|| {
    publishing(
        "",
        r"
local keep = tonumber(ARGV[1])
local life = redis.call('PTTL', KEYS[1])
if keep < 1 then
  redis.call('DEL', KEYS[1])
elseif life == -1 or life > keep then
  redis.call('PEXPIRE', KEYS[1], keep)
end
redis.call('DEL', KEYS[2])
publish(ARGV[2], ARGV[3])
return 1
",
    )
});

/// Starts a namespace's tag state (`KEYS[1]`, a hash) again, in the generation `ARGV[1]`, at
/// clock 0, where it has none (or not all of it: fields `g` and `c`), or keeps more than
/// `ARGV[2]` fields. Then `g, c` are its generation and clock. Tag fields are 64 hex digits,
/// so they never meet `g` or `c`.
const TAG_STATE_FUNCTIONS: &str = r"
local function tag_state(state, generation, most)
  local g, c = unpack(redis.call('HMGET', state, 'g', 'c'))
  if not g or not c or redis.call('HLEN', state) > most then
    redis.call('DEL', state)
    redis.call('HSET', state, 'g', generation, 'c', '0')
    return generation, '0'
  end
  return g, c
end
";

/// The tag generation and clock of a namespace (`KEYS[1]`, its tag state), started again in
/// the generation `ARGV[1]` where it is gone (`ARGV[2]`: the most fields it may keep).
/// Reply: `{generation, clock}`.
pub(super) static TAG_CLOCK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{TAG_STATE_FUNCTIONS}{}",
        r"
local g, c = tag_state(KEYS[1], ARGV[1], tonumber(ARGV[2]))
return {g, c}
"
    ))
});

/// Invalidates tags: in the namespace's tag state (`KEYS[1]`, started again in the generation
/// `ARGV[3]` where it is gone or keeps more than `ARGV[4]` fields), moves the clock on,
/// records the new clock for each tag (`ARGV[5..]`, hex digests), and publishes each tag on
/// the channel `ARGV[1]`, tagged with the origin `ARGV[2]`.
pub(super) static INVALIDATE_TAGS: LazyLock<Script> = LazyLock::new(|| {
    publishing(
        TAG_STATE_FUNCTIONS,
        r"
tag_state(KEYS[1], ARGV[3], tonumber(ARGV[4]) - (#ARGV - 4))
local clock = redis.call('HINCRBY', KEYS[1], 'c', 1)
for i = 5, #ARGV do
  redis.call('HSET', KEYS[1], ARGV[i], clock)
  publish(ARGV[1], ARGV[i] .. ARGV[2])
end
return clock
",
    )
});

/// Clears a namespace: starts its tag state (`KEYS[1]`) again in the generation `ARGV[3]`,
/// and publishes the message `ARGV[4]` (that of a clear) on the channel `ARGV[1]`, tagged with
/// the origin `ARGV[2]`.
pub(super) static CLEAR: LazyLock<Script> = LazyLock::new(|| {
    publishing(
        "",
        r"
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'g', ARGV[3], 'c', '0')
publish(ARGV[1], ARGV[4] .. ARGV[2])
return 1
",
    )
});

/// Compare-and-renew of the lock (held, or lapsed while nobody took it): its key lives
/// `ARGV[2]` ms more (its hold, then the time it is kept lapsed), and its third field says
/// that it is kept `ARGV[3]` ms lapsed (see [`lock_value`]), as a lock taken now would.
pub(super) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LOCK_FUNCTIONS}{}",
        r"
local held, l = owns(KEYS[1])
if not held then return 0 end
local head, rest = string.match(l, '^(%x+:%d+)(.*)$')
if not head then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
local tail = string.match(rest, '^:%d+(.*)$') or rest
redis.call('SET', KEYS[1], head .. ':' .. ARGV[3] .. tail, 'PX', ARGV[2])
return 1
"
    ))
});

/// An `EVALSHA` of `script` on `keys`; the caller adds the arguments. Keys and arguments are
/// written straight into the command's one buffer.
pub(super) fn script_call<K: ToRedisArgs>(script: &Script, keys: &[K]) -> Cmd {
    // Room for the hash, the keys and a few small arguments without regrowing; a value
    // written into the call grows it once.
    let mut call = Cmd::with_capacity(8, 256);
    call.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
    for key in keys {
        call.arg(key);
    }
    call
}

/// A command on a key with room for `args` arguments (name and key included) and, for key
/// names of namespaces up to some 60 bytes, their bytes without regrowing.
pub(super) fn command(args: usize, name: &str, key: impl ToRedisArgs) -> Cmd {
    let mut command = Cmd::with_capacity(args, 192);
    command.arg(name).arg(key);
    command
}

/// Adds the arguments with which a script publishes "filled" for `key`: `channel` (its
/// namespace's classic channel or shard channel family), and the message: the key's digest
/// then the store's `origin` tag.
pub(super) fn publish_filled(call: &mut Cmd, key: &StoreKey, channel: String, origin: &[u8]) {
    let mut message = [0u8; 64 + 17];
    message[..64].copy_from_slice(&key.digest().hex_bytes());
    let len = 64 + origin.len().min(17);
    message[64..len].copy_from_slice(&origin[..len - 64]);
    call.arg(channel).arg(&message[..len]);
}

/// Whether a lock key's value is a leader's lock: 32 hex digits (its token) and `:`. What
/// follows is this release's bound, and may grow fields in later releases, which therefore
/// still read as locks here; anything else (but the `fresh` and `failed` markers) was not
/// written by this crate, and counts as no lock at all, never as a lock to wait for.
pub(super) fn is_lock(value: &[u8]) -> bool {
    value.len() > 32 && value[32] == b':' && value[..32].iter().all(u8::is_ascii_hexdigit)
}

/// A leader's lock value: its token, then the remaining life (ms) below which the value it
/// loads counts as stale, so the fill knows how long the value stays fresh, then how long
/// (ms) the lock key is kept after the lock lapsed: the key lives the lock's TTL and this, and
/// the lock holds while more than this is left (see the `Store` trait's "Locks that lapse").
pub(super) fn lock_value(token: LockToken, refresh_below: u64, kept: u64) -> LockValue {
    let mut bytes = [0; LOCK_VALUE_MAX];
    bytes[..32].copy_from_slice(&token.hex_bytes());
    let mut len = 32;
    for field in [refresh_below, kept] {
        let mut digits = itoa::Buffer::new();
        let digits = digits.format(field).as_bytes();
        bytes[len] = b':';
        bytes[len + 1..len + 1 + digits.len()].copy_from_slice(digits);
        len += 1 + digits.len();
    }
    LockValue { bytes, len }
}

/// Whether a leader's lock value (see [`is_lock`]) may have lapsed: it says how long it is
/// kept after it lapses (a lock of this release), which only the server's clock can weigh
/// against its remaining life. An older release's lock holds until it expires.
pub(super) fn may_lapse(lock: &[u8]) -> bool {
    let mut fields = lock.split(|byte| *byte == b':').skip(1);
    let (Some(below), Some(kept)) = (fields.next(), fields.next()) else {
        return false;
    };
    let digits = |field: &[u8]| !field.is_empty() && field.iter().all(u8::is_ascii_digit);
    digits(below) && digits(kept)
}

/// The longest lock value: 32 hex digits, then twice `:` and the 20 digits of the largest
/// `u64`.
const LOCK_VALUE_MAX: usize = 32 + 2 * 21;

/// A lock value ([`lock_value`]), held on the stack: one allocation less per lookup.
pub(super) struct LockValue {
    bytes: [u8; LOCK_VALUE_MAX],
    len: usize,
}

impl std::ops::Deref for LockValue {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_reads_as_a_lock() {
        let token = LockToken::random();
        assert!(is_lock(&lock_value(token, 0, 0)));
        assert!(is_lock(&lock_value(token, u64::MAX, u64::MAX)));
        // A later release may append fields: still a lock.
        assert!(is_lock(&[&lock_value(token, 5, 7)[..], b":more"].concat()));
        for foreign in [
            &b""[..],
            b"fresh",
            b"failed",
            b"0123456789abcdef0123456789abcdef",
            b"0123456789abcdef0123456789abcdeg:1",
            b"0123456789abcdef0123456789abcde:1",
        ] {
            assert!(!is_lock(foreign), "{foreign:?}");
        }
    }

    #[test]
    fn a_lock_of_this_release_says_how_long_it_is_kept_lapsed() {
        let token = LockToken::random();
        let lock = lock_value(token, 250, 5_000);
        assert_eq!(
            &lock[32..],
            b":250:5000",
            "{:?}",
            String::from_utf8_lossy(&lock)
        );
        assert!(may_lapse(&lock));
        assert!(may_lapse(&lock_value(token, u64::MAX, u64::MAX)));
        // An older release's lock: token and bound only.
        let older = [&token.hex_bytes()[..], b":250"].concat();
        assert!(is_lock(&older) && !may_lapse(&older));
    }
}
