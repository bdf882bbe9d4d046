package store

// PurgeOutboxSQL is the purge's DELETE, for the test that checks its plan.
const PurgeOutboxSQL = purgeOutboxSQL

// MarkOutboxSQL is the batched delivered mark, for the test that checks its
// plan.
const MarkOutboxSQL = markOutboxSQL

// ListDialogsSQL is the dialog listing's statement, for the test that
// checks its plan.
var ListDialogsSQL = listDialogsSQL

// UserDialogsSQL is the batched read of users' dialogs, for the test that
// checks its plan.
const UserDialogsSQL = userDialogsSQL

// SetSyncDir replaces how l flushes a folder to disk, for the test of the
// folders Put syncs; SyncDir is the real one.
func (l *LocalBlobs) SetSyncDir(f func(dir string) error) { l.syncDir = f }

var SyncDir = syncDir

// BlobError is the blob store's classification of a file system failure,
// for the test of the errors it tells apart.
var BlobError = blobError

// MigrationSQL is the text of an embedded migration, for the tests that run
// one again.
func MigrationSQL(file string) (string, error) {
	b, err := migrationFiles.ReadFile("migrations/" + file)
	return string(b), err
}
