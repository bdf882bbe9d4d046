-- A rate-limit override must count every caller that reaches its route
-- (docs/ratelimit.md, "Who a family counts"). The limiter skips a family
-- whose subject the caller does not have, and a request left with no family
-- is admitted without a limit: a rule list naming only families no caller of
-- the route has (user on the public config, which takes no token; service on
-- message send, which takes user tokens only; user on the internal inbox,
-- which takes service tokens only; user alone on "other", which service
-- routes fall to as well) was accepted and switched the route's limiting off.
-- Now such a list is refused like any other invalid rule: `[]` stays the one
-- way to say a route is not limited.
--
-- The callers of a route label, by its template, as ratelimit.Callers has
-- them: /v1/public/... an anonymous caller (counted by ip); /v1/internal/...
-- a service (service or ip); "other" a user (user or ip) and a service
-- (service or ip); every other label a user (user or ip). The dialog family
-- counts a dialog, not who calls, so it alone counts no caller.
--
-- The function of migration 0014 is replaced with the same checks and this
-- one at the end (settings/rules_check_test.go still holds both sides to
-- the same answers). Replacing it does not check the rows already stored,
-- so the constraint is added again as 0014 added it: NOT VALID, then
-- validated where every row passes; where one does not, it stays NOT VALID
-- with a warning, the refresh refuses that version as before, and the row
-- can be fixed or deleted but not rewritten as it is.

CREATE OR REPLACE FUNCTION rate_limit_rules_valid(route text, rules jsonb) RETURNS boolean
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
    tpl      text;
    callers  text[];
    caller   text;
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
    IF jsonb_array_length(rules) = 0 THEN
        RETURN true; -- [] : not limited, said explicitly
    END IF;
    -- The callers that reach the route, each with the families whose subject
    -- it always has (ratelimit.Callers): none may be left uncounted.
    tpl := substr(route, strpos(route, ' ') + 1) || '/';
    callers := CASE
        WHEN route = 'other' THEN ARRAY['user', 'service']
        WHEN left(tpl, 11) = '/v1/public/' THEN ARRAY['anonymous']
        WHEN left(tpl, 13) = '/v1/internal/' THEN ARRAY['service']
        ELSE ARRAY['user']
    END;
    FOREACH caller IN ARRAY callers LOOP
        IF NOT (seen && CASE caller WHEN 'anonymous' THEN ARRAY['ip'] ELSE ARRAY[caller, 'ip'] END) THEN
            RAISE EXCEPTION 'rate_limit_policies route %: rules: no family counts %', quote_literal(route),
                    CASE caller WHEN 'anonymous' THEN 'an anonymous caller (ip)'
                                WHEN 'user' THEN 'a user (user or ip)'
                                ELSE 'a service (service or ip)' END
                USING ERRCODE = 'check_violation', CONSTRAINT = 'rate_limit_policies_rules_valid',
                      TABLE = 'rate_limit_policies', COLUMN = 'rules',
                      HINT = 'a limited route counts each of its callers by one family at least; [] leaves a route unlimited; docs/ratelimit.md';
        END IF;
    END LOOP;
    RETURN true;
END
$$;

ALTER TABLE rate_limit_policies DROP CONSTRAINT rate_limit_policies_rules_valid;
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
