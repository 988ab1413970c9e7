-- KEYS: lanes' zsets of workers -> the live member count of each (lapsed ones are dropped)
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = live_count(k)
end
return out
