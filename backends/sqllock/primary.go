package sqllock

import (
	"fmt"
	"reflect"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/guard/driver"
)

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

// onePool refuses a db on which gorm would send the statements of the lock
// table (table, quoted as the statements quote it, and raw, as Migrate
// names it) to another connection pool than db's own: a resolver such as
// dbresolver registered with Sources. A lock's life goes to db's own pool
// (bypassing gorm), so batch renewals, inspection, Purge and Migrate would
// then read and write another lock table in another database, and every
// lease would be lost at its first batch renewal. A resolver with Replicas
// alone sends the statements primary marks to db's own pool, as does one
// within a transaction. The statements are built in a dry run, which sends
// nothing to the database, logs nothing, and shows which pool gorm's
// callbacks chose.
func onePool(db *gorm.DB, table, raw string) error {
	own := unprepared(db.Statement.ConnPool)
	dry := primary(db).Session(&gorm.Session{DryRun: true, Logger: logger.Discard})
	for _, tx := range []*gorm.DB{
		dry.Exec("UPDATE " + table + " SET owner = owner"),
		dry.Table(raw).Exec("UPDATE " + table + " SET owner = owner"),
	} {
		if tx.Error == nil && !samePool(unprepared(tx.Statement.ConnPool), own) {
			return fmt.Errorf("%w: gorm sends statements on %s to another database than the *gorm.DB's own connection pool"+
				" (a resolver such as gorm's dbresolver registered with Sources), and a lock table must be one:"+
				" pass a *gorm.DB opened on the primary without the resolver, or register the resolver with Replicas alone",
				driver.ErrInvalidOption, raw)
		}
	}
	return nil
}

// unprepared is pool without gorm's prepared-statement wrappers, which a
// resolver makes anew for each statement, and of which a Session with
// PrepareStmt on a *gorm.DB that prepares already adds another.
func unprepared(pool gorm.ConnPool) gorm.ConnPool {
	for {
		p, ok := pool.(*gorm.PreparedStmtDB)
		if !ok || p == nil {
			return pool
		}
		pool = p.ConnPool
	}
}

// samePool reports whether a and b are the same connection pool, without
// comparing values that cannot be compared (which would panic): a value is
// asked, not its type, because a comparable type may hold an uncomparable
// value in an interface field (a struct embedding gorm.ConnPool).
func samePool(a, b gorm.ConnPool) bool {
	if reflect.TypeOf(a) != reflect.TypeOf(b) {
		return false
	}
	if !reflect.ValueOf(a).Comparable() || !reflect.ValueOf(b).Comparable() {
		return true // nothing to tell them apart by (nil included): not a resolver's switch
	}
	return a == b
}
