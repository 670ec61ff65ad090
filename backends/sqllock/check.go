package sqllock

import "context"

// Check reports, changing nothing, whether the Locker can work on the
// database as it is, for a program that leaves the schema to others and
// runs no Migrate (an operator's tool): on MySQL, that the session
// autocommits and that the lock table is on a transactional engine, both
// of which Migrate requires too. A release refused midway on a table of
// another engine may have written, and one in a session that does not
// autocommit is undone when the connection closes, so that neither could
// be said done or not done. PostgreSQL and SQLite always pass: each of
// their statements outside a transaction commits on its own, and their
// tables are transactional. Whether the table is there is not checked.
func (l *Locker) Check(ctx context.Context) error {
	if err := autocommits(ctx, l.db, l.d); err != nil {
		return err
	}
	return transactional(ctx, l.db, l.d, l.rawTable)
}

// Check reports, changing nothing, whether the Store can work on the
// database as it is, as Locker.Check does for the idempotency table.
func (s *Store) Check(ctx context.Context) error {
	if err := autocommits(ctx, s.db, s.d); err != nil {
		return err
	}
	return transactional(ctx, s.db, s.d, s.raw)
}
