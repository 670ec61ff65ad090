package sqllock

// SessionName exposes the session lock name of key, so that tests can find
// and kill the database session holding it, as a crash would end it.
func SessionName(l *Locker, key string) any { return l.sessionName(key) }
