-- How a recovery incident ended, when a person closed it (`flashsale incidents resolve`):
-- what was decided ('release': the hold fenced and its units given back; 'confirm': the
-- hold's order made), by whom and why. An incident recovery closed itself, once it
-- learned the outcome after all, has none of the three.
ALTER TABLE recovery_incident
    ADD COLUMN decision     VARCHAR(16)   NULL,
    ADD COLUMN resolved_by  VARCHAR(64)   NULL,
    ADD COLUMN note         VARCHAR(1000) NULL;
