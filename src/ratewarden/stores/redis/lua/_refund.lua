-- ratewarden: give back what a multi-tier request counted in one cluster slot when
-- a tier in another slot denied it (see _many.lua, mode "keep").
-- KEYS     the keys written
-- ARGV     now_us ("" = Redis server TIME), then per key: the value the request
--          wrote, the value before it ("" = none), the limit's tick_us
-- A key that changed since (another request counted in between) keeps its count:
-- the refund is skipped, which can only deny more, never admit more.
-- returns  how many keys were restored
local now_us, explicit = clock(ARGV[1])
local restored = 0
for i = 1, #KEYS do
  local key, at = KEYS[i], 3 * i - 1
  local wrote, before, tick_us = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2])
  if redis.call('GET', key) == wrote then
    local px = nil
    if before ~= '' then
      local now = now_us
      if tick_us > 1 then now = fdiv(now_us, tick_us) end
      px = ttl_px(struct.unpack('>d', before), now, tick_us, explicit)
    end
    if px then
      redis.call('SET', key, before, 'PX', px)
    else
      redis.call('DEL', key)
    end
    restored = restored + 1
  end
end
return restored
