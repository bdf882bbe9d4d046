package store

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// privateFolder resolves the symbolic links of the blob folder dir and
// checks that no other local user can change what it holds: the folder
// and every folder above it must belong to the gateway's user or to root,
// and none may be writable by every user, except a folder above it with
// the sticky bit (such as /tmp), where nobody can rename or remove what
// another user made. Anyone who can write to the folder, or rename it or
// a folder above it, can replace a blob with other bytes that are then
// served as the attachment, or delete it; the default folder lies in the
// shared temporary directory, where another user could have made it
// first. The blob store keeps the resolved path, so a link changed later
// cannot move it either.
func privateFolder(dir string) (string, error) {
	resolved, err := filepath.EvalSymlinks(dir)
	if err == nil {
		resolved, err = filepath.Abs(resolved)
	}
	if err != nil {
		return "", err
	}
	uid := os.Geteuid()
	for d := resolved; ; d = filepath.Dir(d) {
		fi, err := os.Lstat(d)
		if err != nil {
			return "", err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != uid {
			return "", fmt.Errorf("%s belongs to another user (uid %d) than the gateway's (uid %d)", d, st.Uid, uid)
		}
		if m := fi.Mode(); m.Perm()&0o002 != 0 && (d == resolved || m&os.ModeSticky == 0) {
			return "", fmt.Errorf("%s is writable by every user (mode %o)", d, m.Perm())
		}
		if filepath.Dir(d) == d {
			return resolved, nil
		}
	}
}
