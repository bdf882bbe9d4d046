package lua

// The legacy DB2 safety stub (docs/legacy-stub.md): removed with the stub
// by `hanctl redis cutover`. Both scripts run as ACL user legacy_stub, which
// alone may touch han:stub:*; keys are built in store/stub_tasks.go.
var (
	StubTaskCreate = mustLoad("stub_task_create")
	StubTaskPoll   = mustLoad("stub_task_poll")
)
