package sqllock

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// DefaultIdempotencyTable is the table a Store uses unless
// WithStoreTable says otherwise.
const DefaultIdempotencyTable = "warden_idempotency"

// Store is an idempotency.Store on a SQL table. Every call is one
// conditional statement (plus, on MySQL and SQLite, a read where the
// answer to a Claim is the record: on PostgreSQL the claim reads it), with
// leases and retention counted on the database's clock. Create the table
// with Migrate; its DDL (PostgreSQL; bytea is BLOB on SQLite and LONGBLOB on
// MySQL):
//
//	CREATE TABLE warden_idempotency (
//		id          varchar(64) NOT NULL PRIMARY KEY, -- hex SHA-256 of (scope, key)
//		scope       bytea,
//		idem_key    bytea,
//		state       varchar(16) NOT NULL,  -- in_progress | completed
//		fingerprint bytea,
//		owner       bytea,
//		claim_id    varchar(32) NOT NULL,  -- random, one per Claim call
//		response    bytea,
//		expires_at  bigint      NOT NULL   -- lease end, or retention end once completed; µs, database clock
//	);
//	CREATE INDEX idx_warden_idempotency_expires_at ON warden_idempotency (expires_at);
//
// Scopes and keys are opaque bytes, so the primary key is a hash of the
// length-prefixed pair: no two pairs collide by concatenation, and the key
// fits every database's index limits. Expired rows are equivalent to absent
// ones and are reused by the next Claim; Purge deletes those never claimed
// again.
//
// On a table that is missing (Migrate never ran, or its schema is missing)
// or lacks a column, every call fails with an error naming the table and
// the fix, which wraps idempotency.ErrInvalid and driver.ErrInvalidOption,
// not ErrUnavailable: an Executor passes it on rather than as an outage,
// so that httpmw's WithFailOpen does not serve keyed requests unguarded
// and a scheduler's slot claims fail saying why.
type Store struct {
	db    *gorm.DB
	d     dialect
	table string
	raw   string
	// bounded: every statement of the Store returns once its ctx is done
	// (BoundedByContext).
	bounded bool
}

var (
	_ idempotency.Store          = (*Store)(nil)
	_ idempotency.ContextBounded = (*Store)(nil)
)

// BoundedByContext implements idempotency.ContextBounded: it holds on a
// *sql.DB of pgx's database/sql driver for the reason it holds for a
// Locker on the same pool (Locker.BoundedByContext), so that an Executor
// calls the Store on its caller's goroutine.
func (s *Store) BoundedByContext() bool { return s.bounded }

// StoreOption configures a Store.
type StoreOption func(*Store)

// WithStoreTable sets the idempotency table (default
// DefaultIdempotencyTable).
func WithStoreTable(name string) StoreOption {
	return func(s *Store) { s.raw = name }
}

// NewStore returns a store on db. Like New, it does not touch the
// database: run Migrate or create the table first. Settings of db (its
// Logger, its plugins' callbacks) are read when NewStore is called: a
// Logger set on db later does not reach the Store's statements.
func NewStore(db *gorm.DB, opts ...StoreOption) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil *gorm.DB", driver.ErrInvalidOption)
	}
	s := &Store{db: db, raw: DefaultIdempotencyTable}
	for i, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil StoreOption (argument %d)", driver.ErrInvalidOption, i)
		}
		o(s)
	}
	var err error
	if s.d, err = dialectOf(db); err != nil {
		return nil, err
	}
	if s.table, err = quoteTable(db, s.raw); err != nil {
		return nil, err
	}
	s.bounded = boundedPool(db.Statement.ConnPool)
	s.db = primary(db)
	return s, nil
}

// idemRow is the idempotency table's schema, for AutoMigrate.
type idemRow struct {
	ID          string `gorm:"column:id;primaryKey;type:varchar(64);not null"`
	Scope       []byte `gorm:"column:scope"`
	Key         []byte `gorm:"column:idem_key"`
	State       string `gorm:"column:state;type:varchar(16);not null"`
	Fingerprint []byte `gorm:"column:fingerprint"`
	Owner       []byte `gorm:"column:owner"`
	ClaimID     string `gorm:"column:claim_id;type:varchar(32);not null"`
	Response    []byte `gorm:"column:response"`
	ExpiresAt   int64  `gorm:"column:expires_at;not null;index"`
}

// Migrate creates or updates the idempotency table with gorm's AutoMigrate.
func (s *Store) Migrate(ctx context.Context) error {
	return migrate(ctx, s.db, s.d, s.raw, &idemRow{})
}

// recordID is the row's primary key for (scope, key).
func recordID(scope, key string) string {
	h := sha256.New()
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(scope)))
	h.Write(n[:])
	h.Write([]byte(scope))
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil))
}

// storeErr classifies err, the database's answer to the Store's op. A
// table never migrated is no outage that a retry outlasts, and must not
// read as one (see Store): an Executor passes on an idempotency.ErrInvalid
// as it is, and makes any other error an ErrUnavailable.
func (s *Store) storeErr(ctx context.Context, op string, err error) error {
	switch {
	case missingSchema(err):
		return fmt.Errorf("%w: idempotency %s: %w", idempotency.ErrInvalid, op,
			notMigrated("idempotency", s.table, "run Store.Migrate, or create it with the DDL of Store's documentation", err))
	case deniedPrivilege(err):
		return fmt.Errorf("%w: idempotency %s: %w: the database user may not use the idempotency table %s: grant it SELECT, INSERT, UPDATE and DELETE there: %w",
			idempotency.ErrInvalid, op, driver.ErrInvalidOption, s.table, err)
	}
	err = unavailable(ctx, fmt.Errorf("idempotency %s: %w", op, err))
	if errors.Is(err, driver.ErrInvalidOption) && op == "claim" {
		// Prepared statements lost behind a pooler: a setup to mend too,
		// which a claim must not pass for an outage (WithFailOpen would
		// serve the request unguarded). The calls that end a claim stay
		// ErrUnavailable, which the Executor tries again: the pooler may
		// send the next one to a server connection that knows the
		// statement, and a completion given up on leaves the request to
		// run again once its claim lapses.
		return fmt.Errorf("%w: %w", idempotency.ErrInvalid, err)
	}
	return err
}

// Claim implements idempotency.Store.
func (s *Store) Claim(ctx context.Context, c idempotency.Claim) (*idempotency.Record, error) {
	if err := errors.Join(idempotency.CheckContext(ctx), c.Check()); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	id := recordID(c.Scope, c.Key)
	var nonce [16]byte
	rand.Read(nonce[:])
	claimID := hex.EncodeToString(nonce[:])
	now, t := s.d.now, s.table
	cols := " (id, scope, idem_key, state, fingerprint, owner, claim_id, response, expires_at)" +
		" VALUES (?, ?, ?, ?, ?, ?, ?, NULL, " + now + " + ?)"
	var query string
	if s.d.upsert {
		// The row is inserted, or taken over if its lease or retention has
		// run out, in one statement serialised by the row's lock.
		query = "INSERT INTO " + t + " AS t" + cols +
			" ON CONFLICT (id) DO UPDATE SET state = excluded.state, fingerprint = excluded.fingerprint," +
			" owner = excluded.owner, claim_id = excluded.claim_id, response = NULL, expires_at = excluded.expires_at" +
			" WHERE t.expires_at <= " + now
	} else {
		// MySQL: every column keeps its value unless the row has expired;
		// expires_at, which the condition reads, is assigned last. Whether
		// this call won is read back by its claim_id.
		expired := "expires_at <= " + now
		set := func(col, val string) string { return col + " = IF(" + expired + ", " + val + ", " + col + ")" }
		query = "INSERT INTO " + t + cols + " ON DUPLICATE KEY UPDATE " + set("state", "VALUES(state)") + ", " +
			set("fingerprint", "VALUES(fingerprint)") + ", " + set("owner", "VALUES(owner)") + ", " +
			set("response", "NULL") + ", " + set("claim_id", "VALUES(claim_id)") + ", " +
			set("expires_at", "VALUES(expires_at)")
	}
	if s.d.name == "postgres" {
		// One statement claims the row or reads the live record that
		// keeps it from being claimed: a replay costs one round trip.
		query = "WITH a AS (" + query + " RETURNING 1)" +
			" SELECT EXISTS (SELECT 1 FROM a), r.scope, r.idem_key, r.state, r.fingerprint, r.owner, r.response, r.expires_at > " + now +
			" FROM (SELECT 1) AS one LEFT JOIN " + t + " AS r ON r.id = ? AND NOT EXISTS (SELECT 1 FROM a)"
	}
	// A conflicting row that expires between the claim and the read of the
	// live record is claimed on the next round.
	for range 10 {
		if s.d.name == "postgres" {
			rec, claimed, err := s.claimOrRead(ctx, query, id, c, claimID)
			if err != nil {
				return nil, s.storeErr(ctx, "claim", err)
			}
			if claimed || rec != nil {
				return rec, nil
			}
			// The row was neither claimable nor seen live by the
			// statement's snapshot, which is older than the row the
			// claim found: read it as it is now.
			rec, _, live, err := s.read(ctx, id)
			if err != nil {
				return nil, s.storeErr(ctx, "claim", err)
			}
			if live {
				return rec, nil
			}
			continue
		}
		var res *gorm.DB
		for attempt := range retries {
			res = s.db.WithContext(ctx).Exec(query, id, []byte(c.Scope), []byte(c.Key), string(idempotency.StateInProgress),
				[]byte(c.Fingerprint), []byte(c.Owner), claimID, c.Lease.Microseconds())
			if !retryable(ctx, s.db.Statement.ConnPool, res.Error, attempt) {
				break
			}
		}
		if res.Error != nil {
			return nil, s.storeErr(ctx, "claim", res.Error)
		}
		if s.d.upsert && res.RowsAffected > 0 {
			return nil, nil
		}
		rec, winner, live, err := s.read(ctx, id)
		if err != nil {
			return nil, s.storeErr(ctx, "claim", err)
		}
		if !s.d.upsert && winner == claimID {
			return nil, nil
		}
		if live {
			return rec, nil
		}
	}
	return nil, s.storeErr(ctx, "claim", errors.New("record kept expiring under contention"))
}

// claimOrRead runs PostgreSQL's claim, which reports whether it claimed the
// row, or else the record that kept it from doing so when the statement's
// snapshot sees it live (nil when not).
func (s *Store) claimOrRead(ctx context.Context, query, id string, c idempotency.Claim, claimID string) (*idempotency.Record, bool, error) {
	var (
		claimed                     bool
		scope, key, fp, owner, resp []byte
		state                       sql.NullString
		live                        sql.NullBool
	)
	var err error
	for attempt := range retries {
		err = scanRow(s.db.WithContext(ctx).Raw(query, id, []byte(c.Scope), []byte(c.Key), string(idempotency.StateInProgress),
			[]byte(c.Fingerprint), []byte(c.Owner), claimID, c.Lease.Microseconds(), id),
			&claimed, &scope, &key, &state, &fp, &owner, &resp, &live)
		if !retryable(ctx, s.db.Statement.ConnPool, err, attempt) {
			break
		}
	}
	if err != nil || claimed || !live.Bool {
		return nil, claimed, err
	}
	return &idempotency.Record{
		Scope: string(scope), Key: string(key), State: idempotency.State(state.String),
		Fingerprint: string(fp), Owner: string(owner), Response: resp,
	}, false, nil
}

// read returns the row under id, the claim_id that last claimed it and
// whether it is live by the database's clock.
func (s *Store) read(ctx context.Context, id string) (*idempotency.Record, string, bool, error) {
	var (
		scope, key, fp, owner, resp []byte
		state, claimID              string
		live                        bool
	)
	err := scanRow(s.db.WithContext(ctx).Raw("SELECT scope, idem_key, state, fingerprint, owner, response, claim_id, expires_at > "+s.d.now+
		" FROM "+s.table+" WHERE id = ?", id), &scope, &key, &state, &fp, &owner, &resp, &claimID, &live)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, "", false, nil
	}
	if err != nil {
		return nil, "", false, err
	}
	return &idempotency.Record{
		Scope: string(scope), Key: string(key), State: idempotency.State(state),
		Fingerprint: string(fp), Owner: string(owner), Response: resp,
	}, claimID, live, nil
}

// Get implements idempotency.Store.
func (s *Store) Get(ctx context.Context, scope, key string) (*idempotency.Record, error) {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key)); err != nil {
		return nil, err
	}
	rec, _, live, err := s.read(ctx, recordID(scope, key))
	if err != nil {
		return nil, s.storeErr(ctx, "get", err)
	}
	if !live {
		return nil, fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
	}
	return rec, nil
}

// owned is the condition of every owner's write: the row is this owner's
// live in-progress claim, by the database's clock.
func (s *Store) owned() string {
	return " WHERE id = ? AND owner = ? AND state = '" + string(idempotency.StateInProgress) + "' AND expires_at > " + s.d.now
}

// write runs an owner-checked statement; no row matched means ErrNotOwner.
func (s *Store) write(ctx context.Context, op, query string, args ...any) error {
	var res *gorm.DB
	for attempt := range retries {
		res = s.db.WithContext(ctx).Exec(query, args...)
		if !retryable(ctx, s.db.Statement.ConnPool, res.Error, attempt) {
			break
		}
	}
	if res.Error != nil {
		// One statement, sent again only after an answer that it ran
		// nothing.
		return s.storeErr(ctx, op, notSentOr(res.Error))
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("%w: %s", idempotency.ErrNotOwner, op)
	}
	return nil
}

// Extend implements idempotency.Store. An expired lease is not revived.
func (s *Store) Extend(ctx context.Context, scope, key, owner string, lease time.Duration) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner), idempotency.CheckDuration(lease)); err != nil {
		return err
	}
	id := recordID(scope, key)
	err := s.write(ctx, "extend", "UPDATE "+s.table+" SET expires_at = "+s.d.now+" + ?"+s.owned(), lease.Microseconds(), id, []byte(owner))
	if errors.Is(err, idempotency.ErrNotOwner) && s.d.name == "mysql" {
		// MySQL counts changed rows: an extension to the very same
		// expires_at reports none. Check the claim itself.
		var n int64
		if qerr := scanRow(s.db.WithContext(ctx).Raw("SELECT count(*) FROM "+s.table+s.owned(), id, []byte(owner)), &n); qerr != nil {
			return s.storeErr(ctx, "extend", qerr)
		}
		if n > 0 {
			return nil
		}
	}
	return err
}

// Complete implements idempotency.Store.
func (s *Store) Complete(ctx context.Context, scope, key, owner string, response []byte, retention time.Duration) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner), idempotency.CheckDuration(retention), idempotency.CheckResponse(response)); err != nil {
		return err
	}
	if response == nil {
		response = []byte{}
	}
	return s.write(ctx, "complete", "UPDATE "+s.table+" SET state = ?, response = ?, expires_at = "+s.d.now+" + ?"+s.owned(),
		string(idempotency.StateCompleted), response, retention.Microseconds(), recordID(scope, key), []byte(owner))
}

// Abandon implements idempotency.Store.
func (s *Store) Abandon(ctx context.Context, scope, key, owner string) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key), idempotency.CheckOwner(owner)); err != nil {
		return err
	}
	return s.write(ctx, "abandon", "DELETE FROM "+s.table+s.owned(), recordID(scope, key), []byte(owner))
}

// Delete implements idempotency.Deleter.
func (s *Store) Delete(ctx context.Context, scope, key, owner string) error {
	if err := errors.Join(idempotency.CheckContext(ctx), idempotency.CheckKey(scope, key)); err != nil {
		return err
	}
	id := recordID(scope, key)
	db := s.db.WithContext(ctx)
	var res *gorm.DB
	if owner == "" {
		res = db.Exec("DELETE FROM "+s.table+" WHERE id = ?", id)
	} else {
		res = db.Exec("DELETE FROM "+s.table+" WHERE id = ? AND owner = ?", id, []byte(owner))
	}
	if res.Error != nil {
		return s.storeErr(ctx, "delete", notSentOr(res.Error))
	}
	if res.RowsAffected > 0 {
		return nil
	}
	if owner != "" {
		// Nothing of owner's: another's live record, or none. The delete
		// changed nothing, whatever this read's failure.
		var n int64
		if err := scanRow(db.Raw("SELECT count(*) FROM "+s.table+" WHERE id = ? AND expires_at > "+s.d.now, id), &n); err != nil {
			return driver.NotSent(s.storeErr(ctx, "delete", err))
		}
		if n > 0 {
			return fmt.Errorf("%w: delete of %q: the record has another owner", idempotency.ErrNotOwner, key)
		}
	}
	return fmt.Errorf("%w: %q", idempotency.ErrNotFound, key)
}

// Purge deletes the records whose lease or retention has run out, which
// Claim would otherwise reuse only if their key came again. Run it now and
// then; it returns how many rows it deleted.
func (s *Store) Purge(ctx context.Context) (int64, error) {
	if err := idempotency.CheckContext(ctx); err != nil {
		return 0, err
	}
	res := s.db.WithContext(ctx).Exec("DELETE FROM " + s.table + " WHERE expires_at <= " + s.d.now)
	if res.Error != nil {
		return 0, s.storeErr(ctx, "purge", res.Error)
	}
	return res.RowsAffected, nil
}
