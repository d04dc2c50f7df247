-- Create the bench space when it is missing (memtx, a TREE primary key on the unsigned id),
-- then empty it so every run starts from nothing.  Tuples are {id, counter, payload}.
local name = ...
local FORMAT = {{name = 'id', type = 'unsigned'}, {name = 'counter', type = 'unsigned'},
                {name = 'payload', type = 'scalar'}}
local space = box.space[name]
if space == nil then
    space = box.schema.space.create(name, {engine = 'memtx', format = FORMAT})
end
-- Separately: a user may hold the grant to create a space but not its index.
if space.index[0] == nil then
    space:create_index('primary', {type = 'tree', parts = {1, 'unsigned'}})
end
space:truncate()
-- SQL (the execute operation) needs the fields' names; a space made without them gets them.
if #space:format() == 0 then
    pcall(space.format, space, FORMAT)
end
-- What the call operation calls by default: a get by key.
rawset(_G, 'bench_get', function(key) return box.space[name]:get(key) end)
return space.id
