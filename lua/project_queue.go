package lua

// Project Redis API: topics, subscriptions, claims, receipts and budgets
// (docs/project-redis-api.md). Every project script touches only the keys of
// one project, which share the hash tag {<env>:<project_id>}; the module
// budget scripts touch only the keys under {<env>:module}.
var (
	ProjectTopicCreate          = mustLoad("project_topic_create")
	ProjectTopicDelete          = mustLoad("project_topic_delete")
	ProjectTopicPublish         = mustLoad("project_topic_publish")
	ProjectTopicTrim            = mustLoad("project_topic_trim")
	ProjectTopicMessages        = mustLoad("project_topic_messages")
	ProjectTopicSubCreate       = mustLoad("project_topic_sub_create")
	ProjectTopicSubStatus       = mustLoad("project_topic_sub_status")
	ProjectTopicSubDelete       = mustLoad("project_topic_sub_delete")
	ProjectTopicClaim           = mustLoad("project_topic_claim")
	ProjectTopicAck             = mustLoad("project_topic_ack")
	ProjectTopicReceipts        = mustLoad("project_topic_receipts")
	ProjectTopicState           = mustLoad("project_topic_state")
	ProjectTopicBudgetReserve   = mustLoad("project_topic_budget_reserve")
	ProjectTopicBudgetSettle    = mustLoad("project_topic_budget_settle")
	ProjectTopicBudgetReconcile = mustLoad("project_topic_budget_reconcile")
)
