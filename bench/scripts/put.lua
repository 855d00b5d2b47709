-- PUT /v1/kv/<random key 1..10000> with a rising token (one thread: one counter)
local counter = 0
local base = 2000000000000000
local body = '{"n": 42, "by": "bench"}'
local bearer = os.getenv("BEARER")
request = function()
  counter = counter + 1
  local key = math.random(1, 10000)
  local headers = {["X-Fencing-Token"] = string.format("%d%06d", os.time(), counter % 1000000), ["Content-Type"] = "application/json"}
  if bearer and bearer ~= "" then headers["Authorization"] = "Bearer " .. bearer end
  return wrk.format("PUT", "/v1/kv/" .. key, headers, body)
end
