-- The maka ledger lives beside Temporal's databases on the same PostgreSQL server, in its own
-- database and role (Temporal's auto-setup creates `temporal` and `temporal_visibility`).
-- Runs once, when the data volume is first initialised. Change the password for anything real.
CREATE ROLE maka LOGIN PASSWORD 'maka';
CREATE DATABASE maka OWNER maka;
