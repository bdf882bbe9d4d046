-- A settings state is named by its version and a stamp, not by the number
-- alone (docs/runtime-settings.md). PostgreSQL can go back in time: a
-- failover to a replica that had not received the last settings commit, a
-- point-in-time restore. The next change then reuses a version number that
-- running instances have already applied with other content, and that a
-- shared Redis snapshot may still hold; only the stamp tells the two apart.
--
-- The stamp is drawn anew by a row trigger on every update of settings_head,
-- whoever makes it (the settings_bump trigger, or an operator repairing the
-- row by hand), so two states of the row never share one.
ALTER TABLE settings_head ADD COLUMN stamp uuid NOT NULL DEFAULT gen_random_uuid();

CREATE FUNCTION settings_head_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.stamp := gen_random_uuid();
    RETURN NEW;
END
$$;

CREATE TRIGGER settings_head_stamp BEFORE UPDATE ON settings_head
    FOR EACH ROW EXECUTE FUNCTION settings_head_stamp();
