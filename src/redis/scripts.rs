//! The two Lua scripts the fleet limiter (`redis::RedisLimiter`, feature `redis`) runs on
//! the Redis server, and the format of the value they keep at each limited key (cargo
//! feature `redis-scripts`, which needs no Redis client).
//!
//! Another client of the same keys runs this very text, so that its decisions are the
//! fleet limiter's: paceline's Python package ships it from here. The calling convention:
//! `KEYS[1]` is `<prefix>:{<key>}` (default prefix `paceline`; the key is its own hash
//! tag); [`DECIDE`]'s and [`REFUND`]'s `ARGV` are listed on each.
//!
//! ```
//! use paceline::redis_scripts::{DECIDE, MAX_WINDOW, REFUND};
//! assert!(DECIDE.contains("redis.call('TIME')") && REFUND.contains("redis.call('GET'"));
//! assert_eq!(MAX_WINDOW, 1 << 52);
//! ```
//!
//! # Implementation notes
//!
//! **Exact arithmetic in doubles.** Redis runs Lua 5.1, whose numbers are doubles: exact
//! for integers up to 2^53. Server time (`TIME`) is in microseconds since 1970, about
//! 2^51 now; nanoseconds since 1970 would not be exact. So a key's value keeps its TAT in
//! *nanoseconds relative to the time it was written*: `"<written µs> <TAT - written, ns>"`.
//! Each decision reads `now` in microseconds, turns the stored TAT into nanoseconds ahead
//! of `now` (`ahead = stored - (now - written) * 1000`), decides in nanoseconds exactly as
//! the in-process limiter does (interval, tolerance and cost are whole nanoseconds, so a
//! 1.999 µs interval is 1999 ns, not 1 µs), and writes the new TAT relative to `now`
//! again. Every quantity stays below 2^53 ns (104 days): the limiter refuses quotas whose
//! burst window is longer than `MAX_WINDOW` when it is built, and caps how far ahead a
//! booking may reach at the same bound.
//!
//! **Bookings that can always be given back.** A waiting caller books with an id of its
//! own, chosen before the call is sent; the value then lists the bookings made since the
//! last plain admission (`" id:cost"`, at most `MAX_BOOKINGS`, oldest dropped first).
//! `REFUND` marks its booking cancelled (negative cost) and unwinds every cancelled
//! booking at the end of the list, taking their cost off the TAT: the state is then as if
//! they had never been made. A booking behind a cancelled one that is still live keeps it
//! from unwinding (that booking's instant was computed behind it), and a plain admission
//! clears the list (it fitted after every booking, relying on them). So a refund never
//! frees room that someone after it relied on, whatever order the refunds arrive in, and
//! a booking whose answer never reached its caller (a timeout, a caller that went away)
//! is refunded by id as well as one that was answered.
//!
//! **Errors are answers.** A value the scripts cannot read (not the format above, a TAT
//! out of range, or one written more than a minute before it would have expired: no
//! limiter left it there) is reported with a `CORRUPT` error, never read as 0 and never
//! overwritten; a value
//! of another type fails `GET` with `WRONGTYPE`; a full server fails the write with
//! `OOM`. The limiter reports those as what they are, not as Redis being unreachable.

/// The longest burst window a fleet limiter accepts, in nanoseconds: 2^52 (about 52
/// days), so that a TAT plus the longest booking stays exact in a double. Also the
/// furthest a booking may reach past the tolerance (`DECIDE`'s fifth argument).
///
/// # Examples
///
/// ```
/// // 1 per day with a burst of 60 is a 60-day window: more than a fleet limiter keeps.
/// let window_ns: u64 = 86_400 * 1_000_000_000 * 60;
/// assert!(window_ns > paceline::redis_scripts::MAX_WINDOW);
/// ```
pub const MAX_WINDOW: u64 = 1 << 52;

/// Bookings remembered per key for refunds (module docs): the `32` in [`DECIDE`].
#[cfg(test)]
pub(crate) const MAX_BOOKINGS: usize = 32;

/// Lua that sets `now` (µs): the fixed time in `ARGV[$arg]` when it is not empty (test
/// mode), else the server's `TIME`.
macro_rules! lua_now {
    ($arg:literal) => {
        concat!(
            "local now\nif ARGV[",
            $arg,
            "] ~= '' then\n  now = tonumber(ARGV[",
            $arg,
            "])\n",
            "else\n  local t = redis.call('TIME')\n",
            "  now = tonumber(t[1]) * 1000000 + tonumber(t[2])\nend\n"
        )
    };
}

/// The GCRA decision in nanoseconds. `ARGV`: interval, tolerance (interval × burst),
/// cost (interval × cells; -1 for a read), a fixed time in µs (empty: the server's
/// `TIME`), how far past the tolerance a booking may reach (0 for a plain check), and the
/// booking's id (empty for a plain check). Returns `{1, ahead, wait}` when admitted
/// (`ahead`: the new TAT minus now; booked: `wait` until its instant), `{0, wait, 0}` when
/// not (`wait` at least 1), `{2, remaining, ahead}` for a read (`ahead`: the TAT minus
/// now, so `n` cells wait `ahead - (tolerance - n × interval)`). All times in nanoseconds.
///
/// # Examples
///
/// ```
/// // Sent with EVALSHA by its SHA-1, loaded once per server with SCRIPT LOAD.
/// assert!(paceline::redis_scripts::DECIDE.starts_with("\nlocal interval = tonumber(ARGV[1])"));
/// ```
pub const DECIDE: &str = concat!(
    r"
local interval = tonumber(ARGV[1])
local tau = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local extra = tonumber(ARGV[5])
local id = ARGV[6]
",
    lua_now!(4),
    r"local ahead, list = 0, ''
local v = redis.call('GET', KEYS[1])
if v then
  local written, tat, rest = string.match(v, '^(%d+) (%-?%d+)(.*)$')
  if not written or (string.gsub(rest, ' [^ :]+:%-?%d+', '')) ~= '' then
    return redis.error_reply('CORRUPT unreadable rate-limit state at ' .. KEYS[1])
  end
  ahead = tonumber(tat) - (now - tonumber(written)) * 1000
  list = rest
  -- Past 2^53 ns ahead (or not a number at all) no limiter wrote it. Nor, on the
  -- server's clock, a minute or more behind: a value expires with its TAT.
  if not (ahead < 9007199254740992) or (ARGV[4] == '' and ahead < -60000000000) then
    return redis.error_reply('CORRUPT rate-limit state out of range at ' .. KEYS[1])
  end
end
if ahead < 0 then ahead = 0 end
if ahead == 0 then list = '' end
if cost < 0 then
  if ahead >= tau then return {2, 0, ahead} end
  return {2, math.floor((tau - ahead) / interval), ahead}
end
if ahead > tau + extra - cost then
  return {0, ahead - (tau - cost), 0}
end
if cost == 0 then return {1, ahead, 0} end
local new = ahead + cost
if id == '' then
  list = ''
else
  list = list .. ' ' .. id .. ':' .. string.format('%d', cost)
  local n = 0
  for _ in string.gmatch(list, ' ') do n = n + 1 end
  while n > 32 do
    list = string.gsub(list, '^ [^ ]+', '', 1)
    n = n - 1
  end
end
local value = string.format('%d %d', now, new) .. list
if ARGV[4] ~= '' then
  -- Test mode: the server's clock is not the decisions' clock, so no expiry by it.
  redis.call('SET', KEYS[1], value)
else
  redis.call('SET', KEYS[1], value, 'PX', math.ceil(new / 1000000) + 1)
end
local wait = new - tau
if wait < 0 then wait = 0 end
return {1, new, wait}
"
);

/// Gives a booking back by its id (module docs). `ARGV`: the id, a fixed time in µs
/// (empty: the server's `TIME`). Returns 1 if the booking was found live and is now
/// cancelled (its cost taken off the TAT at once or once the bookings after it are
/// cancelled too), 0 otherwise.
///
/// # Examples
///
/// ```
/// assert!(paceline::redis_scripts::REFUND.contains("ARGV[1]"));
/// ```
pub const REFUND: &str = concat!(
    lua_now!(2),
    r"local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local written, tat, rest = string.match(v, '^(%d+) (%-?%d+)(.*)$')
if not written then return 0 end
local entries, found = {}, false
for bid, c in string.gmatch(rest, ' ([^ :]+):(%-?%d+)') do
  local cost = tonumber(c)
  if bid == ARGV[1] and cost > 0 then
    cost = -cost
    found = true
  end
  entries[#entries + 1] = {bid, cost}
end
if not found then return 0 end
local ahead = tonumber(tat) - (now - tonumber(written)) * 1000
while #entries > 0 and entries[#entries][2] < 0 do
  ahead = ahead + entries[#entries][2]
  entries[#entries] = nil
end
if ahead <= 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
local list = ''
for _, e in ipairs(entries) do
  list = list .. ' ' .. e[1] .. ':' .. string.format('%d', e[2])
end
local value = string.format('%d %d', now, ahead) .. list
if ARGV[2] ~= '' then
  redis.call('SET', KEYS[1], value)
else
  redis.call('SET', KEYS[1], value, 'PX', math.ceil(ahead / 1000000) + 1)
end
return 1
"
);

/// A fleet budget's read ([`crate::budget::fleet`]): `KEYS` the budget's value and its
/// epochs (`<prefix>:{<name>}:budget` and `<prefix>:{<name>}:epochs`: one hash tag, so
/// one slot of a cluster). Returns the value (`''` where there is none), the server's
/// `TIME` (seconds, microseconds) and the epochs' `head` and `queue` counts.
///
/// # Examples
///
/// ```
/// assert!(paceline::redis_scripts::BUDGET_READ.contains("redis.call('TIME')"));
/// ```
pub const BUDGET_READ: &str = r"
local t = redis.call('TIME')
local e = redis.call('HMGET', KEYS[2], 'head', 'queue')
return {redis.call('GET', KEYS[1]) or '', t[1], t[2], e[1] or '0', e[2] or '0'}
";

/// A fleet budget's write: the value in `ARGV[2]` with a time to live of `ARGV[3]` ms,
/// only where the value at `KEYS[1]` still has generation `ARGV[1]` (`0`: no value), and
/// the epochs at `KEYS[2]` moved by `ARGV[4]` (head) and `ARGV[5]` (queue). Returns 1 if
/// written, 0 if another client wrote first (nothing done: read and decide again).
///
/// # Examples
///
/// ```
/// assert!(paceline::redis_scripts::BUDGET_WRITE.contains("PLB1"));
/// ```
pub const BUDGET_WRITE: &str = r"
local v = redis.call('GET', KEYS[1])
local g = '0'
if v then
  g = string.match(v, '^PLB1 (%d+)\n')
  if not g then
    return redis.error_reply('CORRUPT the value at ' .. KEYS[1] .. ' is not a budget')
  end
end
if g ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if ARGV[4] ~= '0' then redis.call('HINCRBY', KEYS[2], 'head', ARGV[4]) end
if ARGV[5] ~= '0' then redis.call('HINCRBY', KEYS[2], 'queue', ARGV[5]) end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_keeps_the_documented_number_of_bookings() {
        assert!(DECIDE.contains(&format!("while n > {MAX_BOOKINGS} do")));
    }
}
