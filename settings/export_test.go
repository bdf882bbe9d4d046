package settings

// SetInLock installs a hook that runs while p holds the refresh lock.
func SetInLock(p *Provider, f func()) { p.inLock = f }
