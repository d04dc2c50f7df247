-- Test fixture for gtarantool: users, spaces and functions the tests use.
box.once('gtarantool-tests', function()
    box.schema.user.create('test', {password = 'secret'})
    box.schema.user.grant('test', 'read,write,execute,create,drop,alter', 'universe')
    box.schema.user.grant('guest', 'read,write,execute', 'universe')

    local s = box.schema.space.create('tester', {format = {
        {name = 'id', type = 'unsigned'},
        {name = 'name', type = 'string'},
        {name = 'value', type = 'any', is_nullable = true},
    }})
    s:create_index('primary', {parts = {'id'}})
    s:create_index('by_name', {parts = {'name'}, unique = false})

    local k = box.schema.space.create('kv', {format = {
        {name = 'key', type = 'string'},
        {name = 'n', type = 'unsigned'},
    }})
    k:create_index('primary', {parts = {'key'}})

    box.execute([[CREATE TABLE sqltest (id INTEGER PRIMARY KEY, name TEXT)]])
end)

local fiber = require('fiber')

function echo(...) return ... end
function sleep_and_return(t, v) fiber.sleep(t) return v end
function raise_error(msg) box.error{code = 555, reason = msg} end
function raise_lua(msg) error(msg) end
function push_three(v)
    for i = 1, 3 do box.session.push({i, v}) end
    return 'done'
end
function big_tuple(n) return string.rep('x', n) end
