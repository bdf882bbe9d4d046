package settings

// SetInLock installs a hook that runs while p holds the refresh lock.
func SetInLock(p *Provider, f func()) { p.inLock = f }

// SealSnapshot is the stored value of snapshot JSON body under Redis key
// name, signed as instances with secret sign it.
func SealSnapshot(secret []byte, name string, body []byte) []byte {
	return (&Provider{key: signingKey(secret)}).sealed(name, body)
}

// OpenSnapshot is the JSON of stored snapshot value v of key name, and
// whether v is signed with secret.
func OpenSnapshot(secret []byte, name string, v []byte) ([]byte, bool) {
	return (&Provider{key: signingKey(secret)}).opened(name, v)
}
