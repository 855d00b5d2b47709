-- PUT /v1/kv/<random key 1..10000> with a rising token (one thread: one counter)
local counter = 0
local base = 2000000000000000
local body = '{"n": 42, "by": "bench"}'
request = function()
  counter = counter + 1
  local key = math.random(1, 10000)
  return wrk.format("PUT", "/v1/kv/" .. key, {["X-Fencing-Token"] = string.format("%d%06d", os.time(), counter % 1000000), ["Content-Type"] = "application/json"}, body)
end
