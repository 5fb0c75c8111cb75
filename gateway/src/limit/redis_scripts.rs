//! The Lua scripts Redis runs for the limits: admission (rate and
//! concurrency limits checked and charged in one call), settlement of token
//! reservations, and the release of concurrency held.
//!
//! Concurrency is counted per holder (one gateway pod's connection) in a
//! hash per limit, `holder → requests in flight`; a holder counts only
//! while its liveness key (`<prefix>alive:<holder>`, refreshed by its pod
//! every [`super::redis_link::ALIVE_REFRESH`], expiring after
//! [`super::redis_link::ALIVE_TTL`]) exists, so a crashed pod's requests
//! stop counting within seconds and its fields are removed by the next
//! admission that reads them.

/// Checks every limiter of a request and, only if all admit, charges each.
/// KEYS: the rate limiters, then the concurrency hashes, then the budget
/// hashes. ARGV[1]: the window (µs); ARGV[2]: how many KEYS are rate
/// limiters; ARGV[3]: the holder; ARGV[4]: the prefix of liveness keys;
/// ARGV[5]: how many KEYS are concurrency hashes; ARGV[6]: the request's
/// own name (`<holder>|<sequence>`, for its budget reservations); then per
/// rate limiter its cost (µs: one request, or the tokens a request
/// reserves), per concurrency hash its limit, and per budget five numbers:
/// its tokens and its cost (-1: none), the request's worst case in tokens
/// and cost (0 where the budget sets no limit), and how long the hash
/// lives (ms, past the period's end). Returns three numbers per limiter:
/// admitted (1/0); for a rate limiter the window used (µs, after the
/// charge when admitted) and the wait until it would admit (µs); for a
/// concurrency limit the requests held (with this one when admitted) and
/// 0; for a budget the tokens and the cost counted before this request
/// (spent, and reserved by live holders). The TAT is kept in µs since
/// 2023-11 (small enough for Lua's doubles to count fractions of a µs) and
/// expires when the limiter is full. A budget hash holds `t` and `c`
/// (spent) and a field per request holding a reservation, `rt:<request>`
/// and `rc:<request>` — set, never added to, so a give-back for a
/// reservation never made removes no other's; a reservation stops
/// counting when its holder's liveness key expires, as concurrency does.
pub const ADMIT: &str = r"
local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1700000000) * 1000000 + tonumber(t[2])
local window = tonumber(ARGV[1])
local rates = tonumber(ARGV[2])
local holder = ARGV[3]
local alive = ARGV[4]
local held_count = tonumber(ARGV[5])
local request = ARGV[6]
local budgets_from = rates + held_count + 1
local out, tats, all = {}, {}, true
for i = 1, rates do
  local cost = tonumber(ARGV[6 + i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat < now then tat = now end
  tats[i] = tat
  local used = tat + cost - now
  local retry = 0
  if used > window then
    all = false
    retry = used - window
    used = tat - now
    out[#out + 1] = 0
  else
    out[#out + 1] = 1
  end
  out[#out + 1] = math.floor(used)
  out[#out + 1] = math.ceil(retry)
end
for i = rates + 1, budgets_from - 1 do
  local limit = tonumber(ARGV[6 + i])
  local fields = redis.call('HGETALL', KEYS[i])
  local held = 0
  for f = 1, #fields, 2 do
    if redis.call('EXISTS', alive .. fields[f]) == 1 then
      held = held + math.max(tonumber(fields[f + 1]) or 0, 0)
    else
      redis.call('HDEL', KEYS[i], fields[f])
    end
  end
  if held + 1 > limit then
    all = false
    out[#out + 1] = 0
    out[#out + 1] = held
  else
    out[#out + 1] = 1
    out[#out + 1] = held + 1
  end
  out[#out + 1] = 0
end
local budget_args = 6 + budgets_from - 1
for i = budgets_from, #KEYS do
  local at = budget_args + (i - budgets_from) * 5
  local limit_t, limit_c = tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local need_t, need_c = tonumber(ARGV[at + 3]), tonumber(ARGV[at + 4])
  local fields = redis.call('HGETALL', KEYS[i])
  local used_t, used_c = 0, 0
  for f = 1, #fields, 2 do
    local name, value = fields[f], math.max(tonumber(fields[f + 1]) or 0, 0)
    if name == 't' then
      used_t = used_t + value
    elseif name == 'c' then
      used_c = used_c + value
    elseif string.match(name, '^r[tc]:[^|]+|') and redis.call('EXISTS', alive .. string.match(name, '^r[tc]:([^|]+)|')) == 1 then
      if string.sub(name, 1, 3) == 'rt:' then used_t = used_t + value else used_c = used_c + value end
    else
      redis.call('HDEL', KEYS[i], name)
    end
  end
  if (limit_t >= 0 and used_t + need_t > limit_t) or (limit_c >= 0 and used_c + need_c > limit_c) then
    all = false
    out[#out + 1] = 0
  else
    out[#out + 1] = 1
  end
  out[#out + 1] = math.min(used_t, 9e18)
  out[#out + 1] = math.min(used_c, 9e18)
end
if all then
  for i = 1, rates do
    local tat = tats[i] + tonumber(ARGV[6 + i])
    redis.call('SET', KEYS[i], string.format('%.3f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
  end
  for i = rates + 1, budgets_from - 1 do
    redis.call('HINCRBY', KEYS[i], holder, 1)
    redis.call('PEXPIRE', KEYS[i], 86400000)
  end
  for i = budgets_from, #KEYS do
    local at = budget_args + (i - budgets_from) * 5
    if ARGV[at + 3] ~= '0' then redis.call('HSET', KEYS[i], 'rt:' .. request, ARGV[at + 3]) end
    if ARGV[at + 4] ~= '0' then redis.call('HSET', KEYS[i], 'rc:' .. request, ARGV[at + 4]) end
    redis.call('PEXPIRE', KEYS[i], ARGV[at + 5])
  end
end
return out
";

/// Settles token reservations after a response. KEYS: token limiters;
/// ARGV[i]: the change (µs of window, negative to give back) for KEYS[i].
/// A limiter is never given back more than makes it full.
pub const SETTLE: &str = r"
local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1700000000) * 1000000 + tonumber(t[2])
for i = 1, #KEYS do
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat < now then tat = now end
  tat = tat + tonumber(ARGV[i])
  if tat > now then
    redis.call('SET', KEYS[i], string.format('%.3f', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
  else
    redis.call('DEL', KEYS[i])
  end
end
return 1
";

/// Counts a request out of concurrency hashes. KEYS: the hashes; ARGV[1]:
/// the holder that counted it. A field that reaches 0 (or was removed
/// meanwhile, its holder taken for dead) is deleted, so counts never go
/// below zero.
pub const RELEASE: &str = r"
for i = 1, #KEYS do
  if redis.call('HINCRBY', KEYS[i], ARGV[1], -1) <= 0 then
    redis.call('HDEL', KEYS[i], ARGV[1])
  end
end
return 1
";

/// Settles what a request reserved in its budgets. KEYS: the budget
/// hashes; ARGV[1]: the request's name (as `ADMIT` was given it); then per
/// hash three integers, as text: the tokens and the cost used, and how
/// long the hash lives (ms). The reservation goes (whether or not it was
/// made), the use is spent; a spend that would pass what a 64-bit integer
/// holds leaves the count at 9·10¹⁸ (spent for any budget) instead of
/// failing the script half-way.
pub const SPEND: &str = r"
local request = ARGV[1]
for i = 1, #KEYS do
  local at = 1 + (i - 1) * 3
  redis.call('HDEL', KEYS[i], 'rt:' .. request, 'rc:' .. request)
  for k, name in ipairs({'t', 'c'}) do
    local used = ARGV[at + k]
    if used ~= '0' then
      local done = redis.pcall('HINCRBY', KEYS[i], name, used)
      if type(done) == 'table' and done.err then
        redis.call('HSET', KEYS[i], name, '9000000000000000000')
      end
    end
  end
  redis.call('PEXPIRE', KEYS[i], ARGV[at + 3])
end
return 1
";

/// Every script, loaded on each connection (a restarted Redis forgot them).
pub const ALL: [&str; 4] = [ADMIT, SETTLE, RELEASE, SPEND];

/// The SHA-1 Redis names a script by (EVALSHA), in hex.
pub fn sha(script: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, script.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}
