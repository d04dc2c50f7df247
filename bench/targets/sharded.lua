-- The bench's storage functions on every storage of a sharded cluster (after
-- vshard.storage.cfg).  The space is the bench's {id, counter, payload} with the
-- bucket in a fourth field and an index on it, as vshard needs to move buckets.
-- Each function returns the rows a plain request would, so the bench checks them the
-- same way (on 3.x as tables: a Lua router forwarding a reply raw would pass 3.x's
-- tuple extension on; before, as tuples: a table would hold the payload as a string);
-- bench_counts are the calls per operation here.
local name = ...
if not box.info.ro then
    box.once('bench-sharded-' .. name, function()
        local space = box.schema.space.create(name, {engine = 'memtx'})
        space:create_index('primary', {type = 'tree', parts = {1, 'unsigned'}})
        space:create_index('bucket_id', {parts = {4, 'unsigned'}, unique = false})
    end)
end
local space = function() return box.space[name] end
local rows_as_tables = tonumber(_TARANTOOL:match('^(%d+)')) >= 3
local function row(t)
    if t ~= nil and rows_as_tables then
        return t:totable()
    end
    return t
end
bench_counts = {insert = 0, select = 0, update = 0, delete = 0, error = 0}

-- An error is raised again with the bytes of its message that are not ASCII as \xNN:
-- a duplicate key's message quotes the binary payload, and a client reads the error
-- as a string in a reply that is not an error reply.  Counted here, as box.stat
-- counts one failed request more than once on a storage.
local function escaped(err)
    bench_counts.error = bench_counts.error + 1
    local message = string.gsub(tostring(err.message or err), '[\128-\255]', function(c)
        return string.format('\\x%02x', c:byte())
    end)
    return box.error.new({code = err.code or 0, reason = message})
end

local function run(fn, ...)
    local ok, result = pcall(fn, ...)
    if not ok then
        box.error(escaped(result))
    end
    return row(result)
end

-- Before 3.0 a binary argument arrives as a Lua string, which a tuple would store as
-- a string: stored as binary (as a plain insert does), the client reads back its bytes.
local msgpack = require('msgpack')
local function binary(payload)
    if type(payload) ~= 'string' then
        return payload   -- 3.x: a varbinary, stored as binary
    end
    local n = #payload
    local head
    if n < 0x100 then
        head = string.char(0xc4, n)
    elseif n < 0x10000 then
        head = string.char(0xc5, bit.rshift(n, 8), bit.band(n, 0xff))
    else
        head = string.char(0xc6, bit.rshift(n, 24), bit.band(bit.rshift(n, 16), 0xff),
                           bit.band(bit.rshift(n, 8), 0xff), bit.band(n, 0xff))
    end
    return msgpack.object_from_raw(head .. payload)
end

function bench_insert(bucket_id, key, payload)
    bench_counts.insert = bench_counts.insert + 1
    return {run(function() return space():insert{key, 0, binary(payload), bucket_id} end)}
end

function bench_select(bucket_id, key)
    bench_counts.select = bench_counts.select + 1
    local rows = space():select(key)
    for i, t in ipairs(rows) do
        rows[i] = row(t)
    end
    return rows
end

function bench_update(bucket_id, key)
    bench_counts.update = bench_counts.update + 1
    return {run(function() return space():update(key, {{'+', 2, 1}}) end)}
end

function bench_delete(bucket_id, key)
    bench_counts.delete = bench_counts.delete + 1
    return {run(function() return space():delete(key) end)}
end

function bench_truncate()
    space():truncate()
end
