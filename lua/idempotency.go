package lua

// Idempotency records and their locks in DB0 (docs/idempotency.md). Every key of one
// call shares the hash tag {<scope>:<user_id>:<key_hmac>}.
var (
	IdemReserve  = mustLoad("idem_reserve")
	IdemComplete = mustLoad("idem_complete")
	IdemRelease  = mustLoad("idem_release")
	IdemExtend   = mustLoad("idem_extend")
	IdemTakeover = mustLoad("idem_takeover")
	IdemAbandon  = mustLoad("idem_abandon")
)
