-- PUT /v1/kv/<random key 1..10000> under one scope with one token, as one lock holder writing
-- from many connections (the load bench's hot-scope step). env: TOKEN (required), PROOF (the
-- X-Fencing-Proof of TOKEN for scope "bench-lock", if an issuer covers it), BEARER (an API key).
local body = '{"n": 42, "by": "bench"}'
local token = os.getenv("TOKEN")
local proof = os.getenv("PROOF")
local bearer = os.getenv("BEARER")
request = function()
  local key = math.random(1, 10000)
  local headers = {["X-Fencing-Token"] = token, ["X-Fencing-Scope"] = "bench-lock", ["Content-Type"] = "application/json"}
  if proof and proof ~= "" then headers["X-Fencing-Proof"] = proof end
  if bearer and bearer ~= "" then headers["Authorization"] = "Bearer " .. bearer end
  return wrk.format("PUT", "/v1/kv/" .. key, headers, body)
end
