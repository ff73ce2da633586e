"""The ORM vocabulary the models and the store are written in: fields, expressions, querysets."""
