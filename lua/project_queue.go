package lua

// Project Redis API: topics, subscriptions, claims, receipts and budgets
// (docs/project-redis-api.md). Every project script touches only the keys of
// one project, which share the hash tag {<env>:<project_id>}; the module
// budget scripts touch only the keys under {<env>:module}.
var (
	ProjectTopicCreate          = mustLoad("project/topic_create")
	ProjectTopicDelete          = mustLoad("project/topic_delete")
	ProjectTopicPublish         = mustLoad("project/topic_publish")
	ProjectTopicTrim            = mustLoad("project/topic_trim")
	ProjectTopicMessages        = mustLoad("project/topic_messages")
	ProjectTopicSubCreate       = mustLoad("project/topic_sub_create")
	ProjectTopicSubStatus       = mustLoad("project/topic_sub_status")
	ProjectTopicSubDelete       = mustLoad("project/topic_sub_delete")
	ProjectTopicClaim           = mustLoad("project/topic_claim")
	ProjectTopicAck             = mustLoad("project/topic_ack")
	ProjectTopicReceipts        = mustLoad("project/topic_receipts")
	ProjectTopicState           = mustLoad("project/topic_state")
	ProjectTopicBudgetReserve   = mustLoad("project/topic_budget_reserve")
	ProjectTopicBudgetSettle    = mustLoad("project/topic_budget_settle")
	ProjectTopicBudgetLease     = mustLoad("project/topic_budget_lease")
	ProjectTopicBudgetReconcile = mustLoad("project/topic_budget_reconcile")
)
