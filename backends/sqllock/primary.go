package sqllock

import "gorm.io/gorm"

// toPrimary is the setting by which gorm's dbresolver plugin
// (gorm.io/plugin/dbresolver, its dbresolver.Write clause) sends a
// statement to its sources rather than to a replica. A plugin that reads
// no such setting ignores it.
const toPrimary = "gorm:db_resolver:write"

// primary is db with every statement sent to the primary database, where
// dbresolver (or a resolver that honours its setting) would send reads to
// a replica. A lock's or a claim's state must be read where it is written:
// MySQL counts the rows an UPDATE changed, not those it matched, so when a
// renewal changed none its owner is checked by a SELECT, which a replica
// that lags answers with the row as it was, still this owner's after the
// lock was force-released and taken by another, and so renews a lease held
// twice; and a Store there could not read back a claim it had just
// written. The statements that bypass gorm go to db's own connection pool,
// the primary's, already. The session is reusable, as db was (each call
// starts from its settings, not from the last call's statement).
func primary(db *gorm.DB) *gorm.DB {
	return db.Set(toPrimary, true).Session(&gorm.Session{})
}
