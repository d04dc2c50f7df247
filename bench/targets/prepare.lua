-- Create the bench space when it is missing (memtx, a TREE primary key on the unsigned id),
-- then empty it so every run starts from nothing.  Tuples are {id, counter, payload}.
local name = ...
local space = box.space[name]
if space == nil then
    space = box.schema.space.create(name, {engine = 'memtx'})
end
-- Separately: a user may hold the grant to create a space but not its index.
if space.index[0] == nil then
    space:create_index('primary', {type = 'tree', parts = {1, 'unsigned'}})
end
space:truncate()
return space.id
