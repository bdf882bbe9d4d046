package store

// PurgeOutboxSQL is the purge's DELETE, for the test that checks its plan.
const PurgeOutboxSQL = purgeOutboxSQL
