package store

// PurgeOutboxSQL is the purge's DELETE, for the test that checks its plan.
const PurgeOutboxSQL = purgeOutboxSQL

// MarkOutboxSQL is the batched delivered mark, for the test that checks its
// plan.
const MarkOutboxSQL = markOutboxSQL

// ListDialogsSQL is the dialog listing's statement, for the test that
// checks its plan.
var ListDialogsSQL = listDialogsSQL
