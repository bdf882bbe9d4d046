-- legacyDeadline applies the project's fixed legacy deadline (epoch ms, 0
-- when not fixed) to the legacy container HASH: past it, the container is
-- deleted; before it, the container expires at it. With canExpire false (the
-- ACL denies PEXPIREAT on the container) a future deadline is left unset
-- rather than failing the call.
local function legacyDeadline(containerKey, deadline, now, canExpire)
  if deadline > 0 and redis.call('EXISTS', containerKey) == 1 then
    if deadline <= now then
      redis.call('DEL', containerKey)
    elseif canExpire and redis.call('PEXPIRETIME', containerKey) ~= deadline then
      redis.call('PEXPIREAT', containerKey, deadline)
    end
  end
end
