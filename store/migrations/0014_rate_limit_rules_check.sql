-- The content of rate_limit_policies.rules is checked when it is written
-- (docs/runtime-settings.md, "Invalid versions"). Until now only the shape
-- was (a JSON array): a row with an unknown family, a zero limit or a stray
-- field was committed, every instance then refused that settings version as
-- a whole at its next refresh, and every later change with it, until someone
-- found the log line. Now the statement that writes such a row fails, naming
-- the rule and the reason, and the version does not move.
--
-- The function below is the refresh's validation (settings/snapshot.go and
-- ratelimit.NewPolicySet) written again in SQL, applied to the value as
-- jsonb stores it, which is the text the refresh decodes: the last of
-- duplicate keys kept, numbers without exponent (1e3 is 1000, 1.0 stays 1.0, -0 is
-- 0). It follows the Go decoder's rules exactly:
--  * each rule is an object (null decodes to an empty rule, refused below);
--  * its keys are family, limit or windowMs, exactly so spelled (no other
--    letter case); any other key is refused;
--  * a null value leaves the field at its zero value (refused below);
--  * family must be a string; limit and windowMs integers (no fraction)
--    within 64 bits, whatever a later key of the same field says;
--  * then: windowMs 1 .. 31536000000 (one year); family user, ip, dialog or
--    service; dialog only on POST /v1/dialogs/{id}/messages; a family once
--    per route; limit >= 1; limit × windowMs <= 2^50.
-- settings/rules_check_test.go writes the same values through both and
-- fails on any disagreement: a change to either side changes the other.
--
-- A CHECK constraint, not a trigger: it covers every way a row is written
-- (INSERT, UPDATE of any column including the route, ON CONFLICT, COPY),
-- cannot be switched off by session_replication_role or DISABLE TRIGGER,
-- shows in \d, and NOT VALID / VALIDATE CONSTRAINT is PostgreSQL's own way
-- of adding a rule over rows that may break it. The function reads nothing
-- but its arguments, so it is IMMUTABLE as a CHECK requires. It raises the
-- violation itself (SQLSTATE 23514, this constraint's name) so that the
-- message says which rule is wrong and why, which a false result would not.
CREATE FUNCTION rate_limit_rules_valid(route text, rules jsonb) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    elem     jsonb;
    idx      bigint;
    fld      record;
    fname    text;
    num      numeric;
    r_family text;
    r_limit  numeric;
    r_window numeric;
    seen     text[] := '{}';
    problem  text;
BEGIN
    IF jsonb_typeof(rules) IS DISTINCT FROM 'array' THEN
        RETURN true; -- the column's own CHECK refuses it
    END IF;
    FOR elem, idx IN SELECT e, o - 1 FROM jsonb_array_elements(rules) WITH ORDINALITY AS a(e, o) ORDER BY o LOOP
        problem := NULL;
        r_family := '';
        r_limit := 0;
        r_window := 0;
        IF jsonb_typeof(elem) <> 'object' THEN
            problem := 'a rule must be an object {"family","limit","windowMs"}, not ' || jsonb_typeof(elem);
        ELSE
            FOR fld IN SELECT k, v FROM jsonb_each(elem) WITH ORDINALITY AS f(k, v, o) ORDER BY o LOOP
                fname := fld.k;
                IF fname NOT IN ('family', 'limit', 'windowMs') THEN
                    problem := 'unknown field ' || quote_literal(left(fld.k, 64));
                ELSIF jsonb_typeof(fld.v) = 'null' THEN
                    CONTINUE;
                ELSIF fname = 'family' THEN
                    IF jsonb_typeof(fld.v) <> 'string' THEN
                        problem := 'family must be a string, not ' || jsonb_typeof(fld.v);
                    ELSE
                        r_family := fld.v #>> '{}';
                    END IF;
                ELSIF jsonb_typeof(fld.v) <> 'number' THEN
                    problem := fld.k || ' must be an integer, not ' || jsonb_typeof(fld.v);
                ELSE
                    num := (fld.v #>> '{}')::numeric;
                    IF scale(num) > 0 THEN
                        problem := fld.k || ' must be an integer, not ' || left(fld.v::text, 40);
                    ELSIF num < -9223372036854775808 OR num > 9223372036854775807 THEN
                        problem := fld.k || ' is out of range';
                    ELSIF fname = 'limit' THEN
                        r_limit := num;
                    ELSE
                        r_window := num;
                    END IF;
                END IF;
                EXIT WHEN problem IS NOT NULL;
            END LOOP;
        END IF;
        IF problem IS NULL THEN
            problem := CASE
                WHEN r_window < 1 OR r_window > 31536000000 THEN
                    'windowMs must be 1 .. 31536000000 (1 ms .. 1 year)'
                WHEN r_family NOT IN ('user', 'ip', 'dialog', 'service') THEN
                    'unknown family ' || quote_literal(left(r_family, 64)) || ' (user, ip, dialog, service)'
                WHEN r_family = 'dialog' AND route <> 'POST /v1/dialogs/{id}/messages' THEN
                    'the dialog family applies to POST /v1/dialogs/{id}/messages only'
                WHEN r_family = ANY (seen) THEN
                    'family ' || r_family || ' twice'
                WHEN r_limit < 1 THEN
                    'limit must be >= 1'
                WHEN r_limit > div(1125899906842624, r_window) THEN
                    'limit × windowMs must be at most 2^50 (1125899906842624)'
            END;
        END IF;
        IF problem IS NOT NULL THEN
            RAISE EXCEPTION 'rate_limit_policies route %: rules[%]: %', quote_literal(route), idx, problem
                USING ERRCODE = 'check_violation', CONSTRAINT = 'rate_limit_policies_rules_valid',
                      TABLE = 'rate_limit_policies', COLUMN = 'rules',
                      HINT = 'rules is a JSON array of {"family","limit","windowMs"}; docs/runtime-settings.md';
        END IF;
        seen := seen || r_family;
    END LOOP;
    RETURN true;
END
$$;

-- NOT VALID first: a database may already hold a row this refuses (written
-- while only the refresh checked it). The migration must not fail on it,
-- and the refresh keeps refusing that version as before. New writes are
-- checked from now on, including any UPDATE of such a row, which must fix
-- its rules (or DELETE it). Where no such row exists the constraint is then
-- validated (a scan of a table of a few rows); where one does, it stays NOT
-- VALID and the migration says which: fix or delete the row, then
-- ALTER TABLE rate_limit_policies VALIDATE CONSTRAINT rate_limit_policies_rules_valid.
ALTER TABLE rate_limit_policies ADD CONSTRAINT rate_limit_policies_rules_valid
    CHECK (rate_limit_rules_valid(route, rules)) NOT VALID;

DO $$
BEGIN
    ALTER TABLE rate_limit_policies VALIDATE CONSTRAINT rate_limit_policies_rules_valid;
EXCEPTION WHEN check_violation THEN
    RAISE WARNING 'rate_limit_policies_rules_valid left NOT VALID: %', SQLERRM
        USING HINT = 'fix or delete the row, then ALTER TABLE rate_limit_policies VALIDATE CONSTRAINT rate_limit_policies_rules_valid';
END
$$;
