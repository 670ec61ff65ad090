package main

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// tableState is one PostgreSQL lock table as the server's statistics saw
// it at one phase of the run: a lock table measured fresh flatters
// whichever lock leaves it the fewest dead rows to step over.
type tableState struct {
	phase, table string
	live, dead   int64
	updates, hot int64 // row updates, and those that were HOT (no index entry)
	vacuums      int64 // manual and automatic
	heap, index  int64 // bytes
}

// agingWorkers is how many workers age a table at once, each on keys of
// its own, so that the churn is the uncontended cycle's.
const agingWorkers = 8

// agingKeys is how many distinct keys each aging worker cycles over: a lock
// table of a service serves many keys, not one.
const agingKeys = 128

// agePostgres has each PostgreSQL subject's lock table serve b.s.churn lock
// cycles before anything is measured, noting the tables before and after.
func (b *bench) agePostgres(ctx context.Context) error {
	if b.s.churn == 0 || !slices.Contains(b.groups, "postgres") || !(b.ran("uncontended") || b.ran("contended")) {
		return nil
	}
	b.notePGTables(ctx, "before aging")
	for _, id := range []string{"warden-pg", "raw-pg"} {
		sub := b.subj[id]
		t0 := time.Now()
		if err := b.age(ctx, sub); err != nil {
			return b.note(ctx, fmt.Errorf("aging: %w", err), "aging", sub, b.s.churn, 0)
		}
		fmt.Fprintf(b.log, "aged %s's table with %d cycles in %v\n", sub.label, b.s.churn, time.Since(t0).Round(time.Second))
	}
	b.notePGTables(ctx, fmt.Sprintf("after %d cycles each", b.s.churn))
	if err := b.vacuumPG(ctx); err != nil {
		return fmt.Errorf("vacuuming the lock tables: %w", err)
	}
	b.notePGTables(ctx, "vacuumed")
	return nil
}

// vacuumPG vacuums both lock tables once they are aged. The aging packs
// hours of a service's churn into minutes, faster than autovacuum's rounds
// (a minute apart) follow: a lock that deletes its row at every release
// leaves its table a hundred thousand dead rows or more, which its next
// statements step over until a vacuum comes, while one that keeps its rows
// leaves next to none. Right after its aging the deleting lock ran at a
// third of the speed it had once its table was next vacuumed, so that its
// figures hung on when autovacuum happened to come. Vacuumed, both tables
// are measured at the same point of autovacuum's round, its start, and
// keep what vacuum does not undo (the index's size, the pages' free room).
func (b *bench) vacuumPG(ctx context.Context) error {
	cfg, err := pgConfig(b.srv.postgres, nil)
	if err != nil {
		return err
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, table := range []string{wardenTable, rawTable} {
		if _, err := conn.Exec(ctx, "VACUUM "+table); err != nil {
			return err
		}
	}
	return nil
}

// age runs b.s.churn cycles of sub spread over agingWorkers workers.
func (b *bench) age(ctx context.Context, sub *subject) error {
	fx, err := sub.fixture(ctx, newMeter(countNothing, b.admin, nil))
	if err != nil {
		return err
	}
	defer fx.close()
	var done atomic.Int64
	return parallel(ctx, agingWorkers, agingWorkers, func(ctx context.Context, i int) error {
		w, err := fx.worker(ctx)
		if err != nil {
			return err
		}
		defer w.close()
		for k := 0; done.Add(1) <= int64(b.s.churn); k++ {
			key := fmt.Sprintf("%s/%d", b.keyFor("aging", sub.id, i, 0, 0), k%agingKeys)
			if err := w.cycle(ctx, key, nop); err != nil {
				return err
			}
		}
		return nil
	})
}

// notePGTables records both lock tables' state for the report.
func (b *bench) notePGTables(ctx context.Context, phase string) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cfg, err := pgConfig(b.srv.postgres, nil)
	if err != nil {
		return
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintf(b.log, "lock tables %s: %v\n", phase, err)
		return
	}
	defer conn.Close(ctx)
	for _, table := range []string{wardenTable, rawTable} {
		st := tableState{phase: phase, table: table}
		err := conn.QueryRow(ctx, `SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd,
	vacuum_count + autovacuum_count, pg_relation_size(relid), pg_indexes_size(relid)
FROM pg_stat_user_tables WHERE relname = $1 AND schemaname = current_schema()`, table).
			Scan(&st.live, &st.dead, &st.updates, &st.hot, &st.vacuums, &st.heap, &st.index)
		if err != nil {
			fmt.Fprintf(b.log, "lock table %s %s: %v\n", table, phase, err)
			continue
		}
		fmt.Fprintf(b.log, "lock table %-26s %-24s live %d dead %d updates %d (HOT %d) vacuums %d heap %s index %s\n",
			table, phase, st.live, st.dead, st.updates, st.hot, st.vacuums, fmtBytes(float64(st.heap)), fmtBytes(float64(st.index)))
		b.tables = append(b.tables, st)
	}
}
