-- The storages' side of the customer service: run on every storage after
-- vshard.storage.cfg.  Customers and their orders carry the customer's bucket,
-- so a customer's rows move together when the rebalancer moves the bucket.
if not box.info.ro then
    box.once('customers-schema', function()
        local customers = box.schema.space.create('customers', {format = {
            {'customer_id', 'unsigned'}, {'bucket_id', 'unsigned'}, {'name', 'string'}}})
        customers:create_index('pk', {parts = {'customer_id'}})
        customers:create_index('bucket_id', {parts = {'bucket_id'}, unique = false})
        local orders = box.schema.space.create('orders', {format = {
            {'order_id', 'unsigned'}, {'customer_id', 'unsigned'}, {'bucket_id', 'unsigned'},
            {'amount', 'unsigned'}}})
        orders:create_index('pk', {parts = {'order_id'}})
        orders:create_index('customer', {parts = {'customer_id'}, unique = false})
        orders:create_index('bucket_id', {parts = {'bucket_id'}, unique = false})
    end)
end

function customer_add(bucket_id, customer_id, name)
    return box.space.customers:insert{customer_id, bucket_id, name}
end

function customer_get(customer_id)
    local customer = box.space.customers:get(customer_id)
    if customer == nil then
        return nil
    end
    local orders = box.space.orders.index.customer:select(customer_id)
    return {customer = customer, orders = orders}
end

function order_add(bucket_id, order_id, customer_id, amount)
    if box.space.customers:get(customer_id) == nil then
        return nil, 'no customer ' .. customer_id
    end
    return box.space.orders:insert{order_id, customer_id, bucket_id, amount}
end

-- This replica set's share of the revenue (map_callrw sums the shares).
function revenue()
    local total = 0
    for _, order in box.space.orders:pairs() do
        total = total + order.amount
    end
    return total
end
