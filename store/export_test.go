package store

// PurgeOutboxSQL is the purge's DELETE, for the test that checks its plan.
const PurgeOutboxSQL = purgeOutboxSQL

// MarkOutboxSQL is the batched delivered mark, for the test that checks its
// plan.
const MarkOutboxSQL = markOutboxSQL

// ListDialogsSQL is the dialog listing's statement, for the test that
// checks its plan.
var ListDialogsSQL = listDialogsSQL

// BlobError is the blob store's classification of a file system failure,
// for the test of the errors it tells apart.
var BlobError = blobError
