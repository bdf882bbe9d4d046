package lua

// Realtime presence (with the per-user connection cap), instance liveness
// and WebSocket tickets (docs/redis-keys.md, docs/realtime-protocol.md).
// Keys are built by package presence and package gateway.
var (
	RTHeartbeat         = mustLoad("rt_heartbeat")
	RTDisconnect        = mustLoad("rt_disconnect")
	RTDisconnectUser    = mustLoad("rt_disconnect_user")
	RTOffline           = mustLoad("rt_offline")
	RTPresence          = mustLoad("rt_presence")
	RTInstanceHeartbeat = mustLoad("rt_instance_heartbeat")
	RTInstancesAdd      = mustLoad("rt_instances_add")
	RTIndexRemove       = mustLoad("rt_index_remove")
	RTIndexUpdate       = mustLoad("rt_index_update")
	RTTicketRedeem      = mustLoad("rt_ticket_redeem")
)
