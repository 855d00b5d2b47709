-- PUT /v1/kv/<random key 1..10000> with a rising token (one thread: one counter)
local counter = 0
-- Tokens start at the clock in µs when wrk loads the script, so a run that follows another
-- within the same second (a warm-up, then the measured window) still sends higher tokens than
-- it, and none of its writes is refused as stale.
local clock = io.popen("date +%s%N")
local start_us = math.floor(tonumber(clock:read("*l")) / 1000)
clock:close()
local body = '{"n": 42, "by": "bench"}'
local bearer = os.getenv("BEARER")
-- TOKEN_BASE: tokens TOKEN_BASE + 1, + 2, ... instead of the clock in µs (under a jump cap,
-- which a fresh key measures from 0).
local token_base = tonumber(os.getenv("TOKEN_BASE") or "")
-- IDEM=1: every PUT carries a fresh Idempotency-Key (what a keyed write costs).
local idem = os.getenv("IDEM") == "1"
request = function()
  counter = counter + 1
  local key = math.random(1, 10000)
  local token = string.format("%d", (token_base or start_us) + counter)
  local headers = {["X-Fencing-Token"] = token, ["Content-Type"] = "application/json"}
  if bearer and bearer ~= "" then headers["Authorization"] = "Bearer " .. bearer end
  if idem then
    headers["Idempotency-Key"] = string.format("wrk-%d-%d-%d", os.time(), counter, math.random(1, 1000000000))
  end
  return wrk.format("PUT", "/v1/kv/" .. key, headers, body)
end
