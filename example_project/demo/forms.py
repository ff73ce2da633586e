from django import forms


class EmailForm(forms.Form):
    """What the page asks for to queue an email."""

    to = forms.EmailField(initial="someone@example.com")
    subject = forms.CharField(max_length=200, initial="Hello from CairnQ")
    body = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), initial="Sent by a worker.")
