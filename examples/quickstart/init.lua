-- The server of the quick start and of examples/flask: a `carts` space and a
-- user `app` (password `secret`) with only the access the examples need.
--
--     tarantool init.lua                 # listens on 3301, data in the current directory
--     LISTEN=127.0.0.1:3302 tarantool init.lua
box.cfg{listen = os.getenv('LISTEN') or 3301}

box.schema.space.create('carts', {if_not_exists = true, format = {
    {name = 'user_id', type = 'unsigned'}, {name = 'status', type = 'string'}}})
box.space.carts:create_index('pk', {parts = {'user_id'}, if_not_exists = true})

box.schema.user.create('app', {password = 'secret', if_not_exists = true})
box.schema.user.grant('app', 'read,write', 'space', 'carts', {if_not_exists = true})
-- A ConnectionPool learns roles by calling box.info (always on 2.6, on a wrong-role
-- error since 2.10): execute on that one function, not on the universe.
box.schema.func.create('box.info', {if_not_exists = true})
box.schema.user.grant('app', 'execute', 'function', 'box.info', {if_not_exists = true})
